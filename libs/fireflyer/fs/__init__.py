"""``fireflyer.fs``: clients of the 3FS-style file system.

- :class:`MetaClient` (:mod:`~fireflyer.fs.meta_client`): namespace operations
  against the meta service, with failover across its replicas;
- :mod:`~fireflyer.fs.meta_codec`: the protobuf <-> msgspec edge both the meta
  service and the client use.

- :func:`connect` -> :class:`FileSystem` (:mod:`~fireflyer.fs.client`): the synchronous
  client: namespace, ``open`` (buffered/text files, :class:`File` with pread/pwrite),
  ``batch_read``/``batch_write``;
- :class:`~fireflyer.fs.fsspec_impl.FireFlyerFileSystem`: fsspec protocol ``ff3fs``
  (imported lazily: fsspec is only needed by those who use it).

Relative paths (no leading ``/``) resolve against the caller's home ``/home/<user>``
(:mod:`~fireflyer.fs.home`).  Results are the ``fireflyer.meta`` models (``Inode``, ``DirEntry`` ...).
"""

from .client import BatchResult, FileSystem, FsClientSettings, connect
from .file import File
from .home import Identity, resolve_path
from .meta_client import MetaClient, parse_addresses

__all__ = ["MetaClient", "parse_addresses", "connect", "FileSystem", "File", "FsClientSettings", "BatchResult",
           "Identity", "resolve_path"]
