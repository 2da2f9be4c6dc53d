"""fsspec's own abstract test suite against ``ff3fs`` on the real cluster.

Until the lead adds the ``fsspec.specs`` entry point, the protocol is registered here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import fsspec
import fsspec.tests.abstract as abstract
import pytest

from fireflyer.fs import FileSystem
from fireflyer.fs.fsspec_impl import FireFlyerFileSystem

fsspec.register_implementation("ff3fs", FireFlyerFileSystem, clobber=True)


class FF3fsFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, ffs: FileSystem) -> FireFlyerFileSystem:
        return FireFlyerFileSystem(ffs, skip_instance_cache=True)

    @pytest.fixture
    def fs_path(self, fs: FireFlyerFileSystem, shared_root: str) -> Iterator[str]:
        path = f"{shared_root}/fsspec-{uuid.uuid4().hex[:8]}"
        yield path
        if fs.exists(path):
            fs.rm(path, recursive=True)


class TestFF3fsCopy(abstract.AbstractCopyTests, FF3fsFixtures):
    pass


class TestFF3fsGet(abstract.AbstractGetTests, FF3fsFixtures):
    pass


class TestFF3fsPut(abstract.AbstractPutTests, FF3fsFixtures):
    pass


class TestFF3fsOpen(abstract.AbstractOpenTests, FF3fsFixtures):
    pass


class TestFF3fsPipe(abstract.AbstractPipeTests, FF3fsFixtures):
    pass


def test_fsspec_url_roundtrip(ffs: FileSystem, shared_root: str) -> None:
    fs = FireFlyerFileSystem(ffs, skip_instance_cache=True)
    url = f"ff3fs://{shared_root}/url-{uuid.uuid4().hex[:6]}/x.bin"
    fs.pipe(url, b"abc" * 1000)
    assert fs.cat(url) == b"abc" * 1000
    assert fs.cat_file(url, start=3, end=9) == b"abcabc"
    assert fs.info(url)["size"] == 3000 and fs.isfile(url)
    with pytest.raises(FileNotFoundError):
        fs.info(url + ".missing")
