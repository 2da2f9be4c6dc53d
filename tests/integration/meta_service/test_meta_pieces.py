"""The meta service's pure pieces: user mapping, settings, codec, chain-table cache, addresses."""

from __future__ import annotations

import pytest

from fireflyer.core.errors import NotFound, SettingsError
from fireflyer.core.settings import load_settings
from fireflyer.fs import meta_codec as codec
from fireflyer.fs import parse_addresses
from fireflyer.meta import DirEntry, FileType, Inode, Layout, LayoutPolicy, ReaddirPage, StatFs
from fireflyer.mgmt.model import ChainTable
from services.meta.app import MetaSettings, kv_url_for
from services.meta.chains import RoutedChainTables
from services.meta.users import ROOT, UID_BASE, UserIds, ids_for, uid_for_name


def test_user_mapping_order() -> None:
    table = {"alice": UserIds(uid=1000, gid=1000, groups=(100,))}
    assert ids_for("alice", admin_role=True, table=table) == ROOT  # the admin role is root
    assert ids_for("alice", admin_role=False, table=table).uid == 1000
    bob = ids_for("bob", admin_role=False, table=table)
    assert bob.uid == bob.gid == uid_for_name("bob") and not bob.admin
    assert uid_for_name("bob") == uid_for_name("bob") != uid_for_name("carol")
    assert all(UID_BASE <= uid_for_name(f"u{i}") < UID_BASE + (1 << 30) for i in range(200))


def test_settings_from_environment(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = load_settings(MetaSettings, env={"FF_STATE_DIR": str(tmp_path), "FF_MGMTD_ADDR": "h:1",
                                         "FF_META_USERS": '{"alice": {"uid": 7, "gid": 8}}',
                                         "FF_META_STATIC_CHAINS": "1,2,3"})
    assert s.mgmtd_addr == "h:1" and s.meta.users["alice"] == UserIds(uid=7, gid=8)
    assert s.meta.static_chains == [1, 2, 3]
    assert kv_url_for(s) == f"sqlite:///{tmp_path.absolute() / 'meta.db'}"
    with pytest.raises(SettingsError) as info:
        load_settings(MetaSettings, env={"FF_META_USERS": '{"alice": {"uid": "x"}}'})
    assert info.value.fields["key"] == "meta.users"


def test_codec_round_trip() -> None:
    lay = Layout(1, 3, 1 << 20, 2, (5, 9))
    pol = LayoutPolicy(2, 1 << 16, 4)
    for inode in (Inode(9, FileType.FILE, 0o640, 5, 6, 1, 123, 1.5, 2.5, 3.5, layout=lay),
                  Inode(10, FileType.DIR, 0o755, 0, 0, 2, 0, 1.0, 1.0, 1.0, parent=1, name="d", dir_policy=pol),
                  Inode(11, FileType.SYMLINK, 0o777, 0, 0, 1, 4, 1.0, 1.0, 1.0, target="/x/y")):
        assert codec.inode_from_pb(codec.inode_to_pb(inode)) == inode
    page = ReaddirPage((DirEntry("a", 3, FileType.FILE), DirEntry("b", 4, FileType.DIR)), True, "b")
    assert codec.page_from_pb(codec.page_to_pb(page)) == page
    st = StatFs(inodes=5, files=2, dirs=2, symlinks=1, used_bytes=10, gc_pending=1)
    assert codec.statfs_from_pb(codec.statfs_to_pb(st)) == st


def test_routed_chain_tables_take_the_newest_version() -> None:
    t = RoutedChainTables()
    with pytest.raises(NotFound):
        t.get_table(1)
    assert t.misses == 1
    assert t.load([ChainTable(table_id=1, version=1, chain_ids=(1, 2)),
                   ChainTable(table_id=1, version=2, chain_ids=(1, 2, 3))], routing_version=5)
    assert t.get_table(1) == (2, (1, 2, 3))
    assert not t.load([], routing_version=5)  # not newer: ignored
    assert t.get_table(1) == (2, (1, 2, 3))


def test_parse_addresses() -> None:
    assert parse_addresses(" a:1, b:2,a:1,, ") == ["a:1", "b:2"]
    assert parse_addresses(["x:1", "x:1", "y:2"]) == ["x:1", "y:2"]
    assert parse_addresses(None) == []
