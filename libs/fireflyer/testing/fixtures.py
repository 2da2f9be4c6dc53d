"""pytest plugin gathering Fire-Flyer's fixtures (listed in tests/conftest.py).

Each fixture lives beside what it starts; this module only re-exports them so
one ``pytest_plugins`` entry brings them all in.
"""

from fireflyer.testing.cluster import local_cluster  # noqa: F401
from fireflyer.testing.kv import kv_store, kv_url, postgres_kv, sqlite_kv  # noqa: F401
from fireflyer.testing.nats import bus, nats_server, nats_settings, unique_domain, unique_subject_prefix  # noqa: F401
from fireflyer.testing.pg import pg_dsn, pg_schema  # noqa: F401
