"""Relative paths resolve against the home (the one rule ff fs, FileSystem and ff3fs use)."""

from __future__ import annotations

import pytest

from fireflyer.core.errors import InvalidArgument
from fireflyer.fs.fsspec_impl import FireFlyerFileSystem
from fireflyer.fs.home import is_relative, resolve_path


@pytest.mark.parametrize(("path", "want"), [
    ("data/x.bin", "/home/alice/data/x.bin"),
    ("x", "/home/alice/x"),
    ("", "/home/alice"),
    (".", "/home/alice"),
    ("./a/b", "/home/alice/a/b"),
    ("../bob/f", "/home/alice/../bob/f"),  # meta resolves '..' through the parent pointer
    ("/ckpt/a", "/ckpt/a"),
    ("/", "/"),
])
def test_resolve_path(path: str, want: str) -> None:
    assert resolve_path(path, "/home/alice") == want
    assert resolve_path(path, "/home/alice/") == want


def test_relative_path_without_a_home_is_invalid() -> None:
    assert resolve_path("/abs", None) == "/abs"
    for home in (None, ""):
        with pytest.raises(InvalidArgument, match="needs a home"):
            resolve_path("rel", home)
    with pytest.raises(InvalidArgument):
        resolve_path(b"x", "/home/a")  # type: ignore[arg-type]
    assert is_relative("a") and not is_relative("/a")


def test_fsspec_keeps_relative_paths_relative_and_urls_absolute() -> None:
    strip = FireFlyerFileSystem._strip_protocol
    assert strip("data/x/") == "data/x"
    assert strip("ff3fs:///data/x") == "/data/x"
    assert strip("ff3fs://data/x") == "/data/x"
    assert strip("/a/") == "/a" and strip("/") == "/" and strip("") == "/"
    assert strip(["a", "/b"]) == ["a", "/b"]
