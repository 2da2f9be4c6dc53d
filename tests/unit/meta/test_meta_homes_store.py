"""Homes: the pure helper (path, plan, hint text) and ``MetaStore.ensure_home`` on a real SQLite KV."""

from __future__ import annotations

import errno as E

import pytest
from meta_util import ADMIN, BOB, TABLES

from fireflyer.core.errors import FsError
from fireflyer.kv import KV
from fireflyer.meta import FileType, FsInvalidArgument, MetaStore
from fireflyer.meta.homes import (
    HOME_MODE,
    HOME_ROOT_MODE,
    HomeStep,
    denied_message,
    gets_home,
    home_path,
    permission_hint,
    plan_home,
    valid_home_name,
)


def test_home_path_is_under_home_and_refuses_names_that_are_not_directory_names() -> None:
    assert home_path("alice") == "/home/alice"
    for bad in ("", ".", "..", "a/b", "a\0b", "x" * 256):
        assert not valid_home_name(bad)
        with pytest.raises(FsInvalidArgument):
            home_path(bad)
    assert valid_home_name("alice.smith") and valid_home_name("x" * 255)


def test_user_role_gets_a_home_service_does_not() -> None:
    assert gets_home(["user"]) and gets_home({"admin", "user"})
    assert not gets_home(["service"]) and not gets_home([])


def test_plan_makes_only_what_is_missing() -> None:
    assert plan_home("alice", 7, 8, root_exists=False, home_exists=False) == [
        HomeStep("/home", HOME_ROOT_MODE, 0, 0), HomeStep("/home/alice", HOME_MODE, 7, 8)]
    assert plan_home("alice", 7, 8, root_exists=True, home_exists=False) == [HomeStep("/home/alice", 0o700, 7, 8)]
    assert plan_home("alice", 7, 8, root_exists=True, home_exists=True) == []


def test_hint_says_where_the_user_may_write_or_whom_to_ask() -> None:
    assert permission_hint("alice", write=True) == \
        "you may write under your home /home/alice, or ask an admin (ff fs chown)"
    assert "ff fs chmod" in permission_hint("alice", write=False)
    assert "/home/alice" in permission_hint("alice", write=False)
    assert "home" not in permission_hint("", write=True)  # no name, no home to point at
    assert denied_message("write on parent", "/data", "alice", write=True) == (
        "permission denied (write on parent /) for /data: you may write under your home /home/alice, "
        "or ask an admin (ff fs chown)")
    assert denied_message("write on parent", "/a/b/", "alice", write=True).startswith(
        "permission denied (write on parent /a) for /a/b/")


@pytest.fixture
def bare(kv: KV) -> MetaStore:
    MetaStore.init(kv)
    return MetaStore(kv, tables=TABLES, alloc_block=64)


def test_ensure_home_makes_home_root_and_home_once(bare: MetaStore) -> None:
    home, created = bare.ensure_home("bob", BOB.uid, BOB.gid)
    assert created and home.type is FileType.DIR and (home.uid, home.gid, home.mode) == (BOB.uid, BOB.gid, 0o700)
    base = bare.stat(ADMIN, "/home")
    assert (base.uid, base.gid, base.mode) == (0, 0, 0o755)
    again, created = bare.ensure_home("bob", BOB.uid, BOB.gid)
    assert not created and again.id == home.id
    # bob can now write in his home and nowhere else
    bare.mkdir(BOB, "/home/bob/data")
    with pytest.raises(FsError) as info:
        bare.mkdir(BOB, "/data")
    assert info.value.errno == E.EACCES
    assert "you may write under your home /home/bob, or ask an admin (ff fs chown)" in str(info.value)
    assert info.value.fields["hint"].startswith("you may write under your home /home/bob")


def test_ensure_home_leaves_an_existing_home_as_an_admin_changed_it(bare: MetaStore) -> None:
    bare.ensure_home("bob", BOB.uid, BOB.gid)
    bare.setattr(ADMIN, "/home/bob", mode=0o750, uid=4242)
    home, created = bare.ensure_home("bob", BOB.uid, BOB.gid)
    assert not created and (home.mode, home.uid) == (0o750, 4242)


def test_ensure_home_refuses_a_file_in_place_of_home(bare: MetaStore) -> None:
    bare.create(ADMIN, "/home")
    with pytest.raises(FsError) as info:
        bare.ensure_home("bob", BOB.uid, BOB.gid)
    assert info.value.errno == E.EEXIST


def test_search_denied_carries_a_hint(bare: MetaStore) -> None:
    bare.mkdir(ADMIN, "/private", 0o700)
    with pytest.raises(FsError) as info:
        bare.stat(BOB, "/private/x")
    assert info.value.errno == E.EACCES and "ff fs chmod" in str(info.value)
