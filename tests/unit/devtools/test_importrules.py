from pathlib import Path

from fireflyer.devtools.importrules import check_source, check_tree


def test_libs_importing_services_is_a_violation():
    v = check_source("import services.mgmtd\n", "fireflyer.kv.store", "libs/fireflyer/kv/store.py")
    assert [x.rule for x in v] == ["libs must not import services"]
    v = check_source("from services.meta.app import X\n", "fireflyer.kv", "libs/fireflyer/kv/__init__.py")
    assert v and v[0].line == 1


def test_service_importing_another_service_is_a_violation():
    v = check_source("from services.meta import inode\n", "services.mgmtd.app", "services/mgmtd/app.py")
    assert [x.rule for x in v] == ["a service must not import another service"]


def test_relative_import_into_a_sibling_service_is_caught():
    v = check_source("from ..meta import inode\n", "services.mgmtd.app", "services/mgmtd/app.py")
    assert v and v[0].imported.startswith("services.meta")


def test_allowed_imports_pass():
    src = "import fireflyer.core\nfrom services.mgmtd import state\nfrom . import state\n"
    assert check_source(src, "services.mgmtd.app", "services/mgmtd/app.py") == []
    assert check_source("from fireflyer.rpc import RpcServer\n", "fireflyer.bus.x", "x.py") == []


def test_the_repository_obeys_the_rules():
    root = Path(__file__).resolve().parents[3]
    assert check_tree(root, ["libs", "services"]) == []
