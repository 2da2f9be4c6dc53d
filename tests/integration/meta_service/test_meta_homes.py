"""Homes against a real meta service: WhoAmI makes ``/home/<user>``, relative paths resolve
there, a user writes in the home and not in ``/`` (with a hint), chmod by the owner, chown
by an admin only.  Each test runs over the wire endpoint and over gRPC (the ``meta`` fixture).

alice is listed in ``[meta.users]`` as uid/gid 1000; bob gets the uid of his name's hash.
"""

from __future__ import annotations

import errno as E

import pytest
from metasvc import Meta

from fireflyer.core.errors import FsError, InvalidArgument
from fireflyer.meta import FileType
from services.meta.users import uid_for_name


async def test_whoami_makes_the_home_once(meta: Meta) -> None:
    async with await meta.client(meta.tokens.alice) as alice, await meta.client(meta.tokens.admin) as admin:
        me = await alice.whoami()
        assert (me.user, me.roles, me.home, me.uid, me.gid) == ("alice", ("user",), "/home/alice", 1000, 1000)
        assert me.home_created
        home = await admin.stat("/home/alice")
        assert (home.type, home.mode, home.uid, home.gid) == (FileType.DIR, 0o700, 1000, 1000)
        base = await admin.stat("/home")
        assert (base.mode, base.uid, base.gid) == (0o755, 0, 0)
        assert not (await alice.whoami()).home_created
        root = await admin.whoami()
        assert (root.user, root.roles, root.uid, root.home) == ("admin", ("admin",), 0, "/home/admin")
        assert sorted(e.name for e in await admin.listdir("/home")) == ["admin", "alice"]



async def test_a_service_is_root_in_the_file_system_and_has_no_home(meta: Meta) -> None:
    """A service credential (role service) acts as root for file operations, as the checkpoint
    service needs to write a MANIFEST into a user's private job directory; it gets no home."""
    async with await meta.client(meta.tokens.alice) as alice, await meta.client(meta.tokens.service) as svc:
        await alice.whoami()
        await alice.mkdir("/home/alice/job", mode=0o700)
        me = await svc.whoami()
        assert (me.user, me.roles, me.uid, me.gid, me.home) == ("svc-checkpoint", ("service",), 0, 0, "")
        made = await svc.create("/home/alice/job/MANIFEST")
        assert made.created and made.inode.uid == 0
        assert sorted(e.name for e in await svc.listdir("/home")) == ["alice"]  # no /home/svc-checkpoint

async def test_user_token_writes_in_its_home_through_relative_paths(meta: Meta) -> None:
    bob_uid = uid_for_name("bob")
    async with await meta.client(meta.tokens.bob) as bob:
        # the first relative path asks WhoAmI, which makes the home
        made = await bob.mkdir("data")
        assert made.uid == bob_uid and made.name == "data"
        assert (await bob.create("data/f.bin")).created
        assert (await bob.stat("/home/bob/data/f.bin")).uid == bob_uid
        assert [e.name for e in await bob.listdir(".")] == ["data"]
        assert [e.name for e in await bob.listdir("")] == ["data"]
        await bob.rename("data/f.bin", "data/g.bin")
        await bob.symlink("g.bin", "data/link")  # a relative target stays relative to the link's dir
        assert await bob.readlink("data/link") == "g.bin"
        assert (await bob.stat("data/link")).type is FileType.FILE
        assert await bob.abspath("./x") == "/home/bob/x"
        await bob.unlink("data/link")
        with pytest.raises(FsError) as info:
            await bob.stat("nope")
        assert info.value.errno == E.ENOENT and info.value.fields["path"] == "/home/bob/nope"


async def test_a_user_cannot_write_slash_and_the_error_says_where_it_may(meta: Meta) -> None:
    async with await meta.client(meta.tokens.bob) as bob, await meta.client(meta.tokens.alice) as alice:
        await alice.whoami()
        with pytest.raises(FsError) as info:
            await bob.mkdir("/data")
        err = info.value
        assert err.errno == E.EACCES and err.fields["path"] == "/data"
        assert "permission denied (write on parent /) for /data" in str(err)
        assert "you may write under your home /home/bob, or ask an admin (ff fs chown)" in str(err)
        with pytest.raises(FsError) as info:
            await bob.create("/home/alice/x")  # another user's home is 0700
        assert info.value.errno == E.EACCES and "ff fs chmod" in str(info.value)


async def test_chmod_by_the_owner_only(meta: Meta) -> None:
    async with await meta.client(meta.tokens.bob) as bob, await meta.client(meta.tokens.alice) as alice:
        await bob.mkdir("shared")
        assert (await bob.setattr("shared", mode=0o755)).mode == 0o755
        assert (await bob.setattr(".", mode=0o711)).mode == 0o711  # the home itself: its owner may
        with pytest.raises(FsError) as info:
            await alice.setattr("/home/bob/shared", mode=0o777)
        assert info.value.errno == E.EPERM


async def test_chown_by_name_is_refused_for_a_user_and_done_for_an_admin(meta: Meta) -> None:
    async with await meta.client(meta.tokens.bob) as bob, await meta.client(meta.tokens.admin) as admin:
        await bob.mkdir("give")
        with pytest.raises(FsError) as info:
            await bob.setattr("give", owner="alice")
        assert info.value.errno == E.EPERM
        assert (await bob.stat("give")).uid == uid_for_name("bob")
        inode = await admin.setattr("/home/bob/give", owner="alice")
        assert (inode.uid, inode.gid) == (1000, 1000)  # alice's ids from [meta.users]
        inode = await admin.setattr("/home/bob/give", owner="carol")
        assert inode.uid == inode.gid == uid_for_name("carol")
        with pytest.raises(InvalidArgument):
            await admin.setattr("/home/bob/give", owner="alice", uid=5)
