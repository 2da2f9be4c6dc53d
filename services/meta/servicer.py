"""``ff.meta.v1.MetaService``: the namespace library behind gRPC (and behind the wire endpoint, wire.py).

Each RPC (1) checks the request's shape (paths absolute, no NUL bytes, modes
in range; lengths, times, flags and path sizes against :mod:`fireflyer.meta.limits`,
which the store applies again for library callers) so malformed input fails with
INVALID_ARGUMENT (errno EINVAL, EFBIG or ENAMETOOLONG) before the store is touched,
(2) maps the bearer token's user to a ``Caller`` (see ``users``),
(3) runs the synchronous :class:`fireflyer.meta.MetaStore` method: read-only
calls inline on the loop when ``inline_reads`` (see :meth:`MetaServicer._read`),
mutations inline when ``inline_writes`` and the KV can commit without waiting,
else on a thread pool (see :meth:`MetaServicer._write`), and (4) converts the msgspec
result to protobuf with :mod:`fireflyer.fs.meta_codec`.  Mutations pass the
request's ``request_id`` to the store, which records the outcome in the KV, so
a client retrying on another replica gets the first outcome back.

Errors are whatever the store raises: ``FsError(errno=..., path=...)`` picks
its gRPC status from the errno (EACCES -> PERMISSION_DENIED, ENOENT ->
NOT_FOUND, ...) and the client gets the same typed error back.  Nothing here
keeps state between calls, so any number of replicas can serve one KV.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import functools
import os
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fireflyer.api.meta.v1 import meta_pb2 as pb
from fireflyer.api.meta.v1 import meta_pb2_grpc
from fireflyer.core.errors import FsError, InvalidArgument, NotFound, Unavailable
from fireflyer.fs import meta_codec as codec
from fireflyer.kv import KVWouldBlock
from fireflyer.meta import Caller, FileType, FsInvalidArgument, Inode, MetaStore
from fireflyer.meta.homes import gets_home, home_path, valid_home_name
from fireflyer.meta.limits import MAX_PATH, check_open_flags, check_path_bytes, check_time
from fireflyer.meta.perms import R, W, access_for_flags, allowed
from fireflyer.rpc import current_principal
from fireflyer.storage.capability import READ, WRITE, CapabilityDenied, Grantor

from .users import UserIds, acts_as_root, ids_for

__all__ = ["MetaServicer", "SERVICE_NAME", "check_path", "check_mode", "request_id"]

SERVICE_NAME = "ff.meta.v1.MetaService"
#: the server's page size when a Readdir asks for 0 (3FS list_default_limit)
DEFAULT_READDIR_LIMIT = 128
MAX_READDIR_LIMIT = 4096
MAX_REQUEST_ID = 64

T = TypeVar("T")


def check_path(path: str, what: str = "path") -> str:
    """Refuse what no store should see: relative, empty, NUL bytes, over PATH_MAX.

    The store validates too; checking here keeps obviously bad requests off the
    thread pool and names which argument (``what``) was wrong.
    """
    if not path:
        raise FsInvalidArgument(f"{what} is empty; give an absolute path like /data/x", path=path, arg=what)
    if not path.startswith("/"):
        raise FsInvalidArgument(f"{what} {path!r} is relative; the meta service takes absolute paths",
                                path=path, arg=what)
    if "\0" in path:
        raise FsInvalidArgument(f"{what} {path!r} contains a NUL byte", path=path, arg=what)
    check_path_bytes(path, what)  # ENAMETOOLONG past PATH_MAX (fireflyer.meta.limits)
    return path


def request_id(request: Any) -> bytes | None:
    """The request's idempotency id (None when the client sent none)."""
    rid: bytes = request.request_id
    if len(rid) > MAX_REQUEST_ID:
        raise FsInvalidArgument(f"request_id is {len(rid)} bytes; the limit is {MAX_REQUEST_ID}",
                                size=len(rid))
    return rid or None


def check_mode(mode: int, path: str) -> int:
    if mode & ~0o7777:
        raise FsInvalidArgument(f"mode {mode:#o} has bits outside 0o7777", path=path, mode=mode)
    return mode


class MetaServicer(meta_pb2_grpc.MetaServiceServicer):
    """Stateless adapter from gRPC to one :class:`MetaStore` (shared by all calls)."""

    def __init__(self, store: MetaStore, *, users: Mapping[str, UserIds], pool: ThreadPoolExecutor,
                 on_unknown_table: Callable[[], Awaitable[bool]] | None = None, inline_reads: bool = True,
                 inline_writes: bool = False, grantor: Grantor | None = None) -> None:
        self.store = store
        #: signs the chunk capabilities Open/Create return (None: none are granted, and the
        #: storage nodes then serve this meta's clients nothing; the service always has one)
        self.grantor = grantor
        self.users = users
        self.pool = pool
        self.on_unknown_table = on_unknown_table
        self.inline_reads = inline_reads
        self.inline_writes = inline_writes and store.kv.supports_nonblocking
        self.calls = 0
        #: mutations tried inline that had to wait and went to the pool instead
        self.deferred = 0
        #: host:port of this replica's wire endpoint (see wire.py); "" when it runs none
        self.wire_address = ""
        #: Caller per principal: the users table is fixed for the servicer's life, and hashing a
        #: name to a uid on every call was a visible share of a small call's server time
        self._callers: dict[Any, Caller] = {}

    # -- plumbing ---------------------------------------------------------------------
    def _caller(self) -> Caller:
        who = current_principal()
        caller = self._callers.get(who)
        if caller is None:
            ids = ids_for(who.user, admin_role=acts_as_root(who.has_role), table=self.users)
            caller = Caller(ids.uid, ids.gid, groups=tuple(ids.groups), admin=ids.admin, user=who.user)
            if len(self._callers) < 4096:  # bounded: principals come from the token store
                self._callers[who] = caller
        return caller

    async def _run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run a store method on the pool, inside this call's context (trace ids in logs)."""
        self.calls += 1
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, fn, *args, **kw)
        return await asyncio.get_running_loop().run_in_executor(self.pool, call)

    async def _read(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run a read-only store call.  Inline on the event loop by default: a snapshot
        read of a few keys takes tens of microseconds and never waits for a lock (WAL
        readers never block; PostgreSQL reads at a snapshot), while the hop to a pool
        thread and back costs more than the read itself and was most of a stat's
        server time in ``ff bench meta``.  Mutations always go to the pool, since a
        commit may wait for the KV's write lock."""
        if self.inline_reads:
            self.calls += 1
            return fn(*args, **kw)
        return await self._run(fn, *args, **kw)

    async def _write(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run a store mutation.  With ``inline_writes`` it first runs on the event loop
        inside ``kv.nonblocking()``: a metadata transaction is a few hundred microseconds
        of CPU, less than the two thread hops to the pool and back cost (GIL hand-offs
        and context switches were the largest share of a create's server time), and the
        KV fails it with ``KVWouldBlock``, having applied nothing, where it would wait
        (the write lock held by another replica, a conflict retry's backoff).  Only
        then does it go to the pool, where waiting is fine.  The store's request id
        keeps the second run exactly-once as any retry."""
        if self.inline_writes:
            self.calls += 1
            try:
                with self.store.kv.nonblocking():
                    return fn(*args, **kw)
            except KVWouldBlock:
                self.deferred += 1
                self.calls -= 1
        return await self._run(fn, *args, **kw)

    async def _run_layout(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Like :meth:`_write` for calls that pick a chain table: when the store says the
        table does not exist (an error carrying ``table``), refresh routing info from
        mgmtd once and retry, since the cache may just not have seen it yet.  When mgmtd
        cannot be asked (the follower gave up after its wait), the call fails Unavailable."""
        try:
            return await self._write(fn, *args, **kw)
        except (InvalidArgument, NotFound) as e:
            if self.on_unknown_table is None or "table" not in e.fields:
                raise
            if not await self.on_unknown_table():
                # not "no such table": this replica could not ask.  Unavailable sends the
                # client to another replica or a later retry instead of failing the create
                raise Unavailable(f"{e.message}: this meta replica's routing cache lacks it and mgmtd did "
                                  "not answer a refresh", **e.fields) from e
        return await self._write(fn, *args, **kw)

    def _capability(self, caller: Caller, inode: Inode, flags: int, created: bool) -> bytes:
        """The chunk capability an open grants: read when the caller may read the file, write
        when it may write it (a file this call created: whatever ``flags`` asked, as POSIX's
        open with O_CREAT gives a writable descriptor whatever the new mode).  The path's own
        checks already passed in the store; root-acting callers may do everything."""
        if self.grantor is None or inode.type is not FileType.FILE:
            return b""
        want = access_for_flags(flags) if created else 0
        mode = (READ if want & R or allowed(caller, inode, R) else 0) | (WRITE if want & W or allowed(caller, inode, W)
                                                                      else 0)
        return self.grantor.grant(inode=inode.id, mode=mode, user=caller.user) if mode else b""

    def _opened(self, caller: Caller, inode_id: int, raw: bytes) -> bool:
        """Whether ``raw`` is a genuine capability granted to ``caller`` for ``inode_id``."""
        if not raw or self.grantor is None:
            return False
        try:
            self.grantor.check_renewal(raw, inode=inode_id, mode=0, user=caller.user)
        except CapabilityDenied:
            return False
        return True

    async def GrantCapability(self, request: pb.GrantCapabilityRequest, context: Any) -> pb.GrantCapabilityReply:
        """Renew a capability: the request presents the one it replaces (so only a file that was
        opened, never a guessed id); the inode's permission bits are checked again, and the new
        capability allows what they allow of what was asked (a chmod revokes at renewal)."""
        caller = self._caller()
        if self.grantor is None:
            raise Unavailable("this meta replica grants no capabilities (no capability key)")
        mode = request.mode & (READ | WRITE)
        if not mode:
            raise FsInvalidArgument(f"capability mode {request.mode} asks for nothing (READ=1, WRITE=2)",
                                    mode=request.mode)
        self.grantor.check_renewal(request.capability, inode=request.inode_id, mode=mode, user=caller.user)
        inode = await self._read(self.store.inode_by_id, request.inode_id)
        now = (READ if mode & READ and allowed(caller, inode, R) else 0) | (
            WRITE if mode & WRITE and allowed(caller, inode, W) else 0)
        if not now:
            raise FsError(f"inode {inode.id}: {caller.user or caller.uid} may no longer access the file "
                          "(its permissions changed since it was opened)", errno=errno.EACCES, inode=inode.id)
        return pb.GrantCapabilityReply(capability=self.grantor.grant(inode=inode.id, mode=now, user=caller.user))

    # -- namespace ----------------------------------------------------------------------
    async def Mkdir(self, request: pb.MkdirRequest, context: Any) -> pb.MkdirReply:
        path = check_path(request.path)
        mode = check_mode(request.mode or 0o755, path)
        policy = codec.policy_from_pb(request.policy) if request.HasField("policy") else None
        inode = await self._run_layout(self.store.mkdir, self._caller(), path, mode, parents=request.parents,
                                       policy=policy, request_id=request_id(request))
        return pb.MkdirReply(inode=codec.inode_to_pb(inode))

    async def Create(self, request: pb.CreateRequest, context: Any) -> pb.OpenReply:
        path = check_path(request.path)
        mode = check_mode(request.mode or 0o644, path)
        check_open_flags(request.flags)
        policy = codec.policy_from_pb(request.policy) if request.HasField("policy") else None
        caller = self._caller()
        res = await self._run_layout(self.store.create, caller, path, mode,
                                     flags=request.flags | os.O_CREAT, policy=policy, request_id=request_id(request))
        return pb.OpenReply(inode=codec.inode_to_pb(res.inode), created=res.created,
                            capability=self._capability(caller, res.inode, request.flags, res.created))

    async def Open(self, request: pb.OpenRequest, context: Any) -> pb.OpenReply:
        path = check_path(request.path)
        check_open_flags(request.flags)
        caller = self._caller()
        if request.flags & (os.O_TRUNC | os.O_CREAT):  # may write
            res = await self._write(self.store.open, caller, path, request.flags)
        else:
            res = await self._read(self.store.open, caller, path, request.flags)
        return pb.OpenReply(inode=codec.inode_to_pb(res.inode), created=res.created,
                            capability=self._capability(caller, res.inode, request.flags, res.created))

    async def Stat(self, request: pb.StatRequest, context: Any) -> pb.StatReply:
        path = check_path(request.path)
        fn = self.store.stat if request.follow else self.store.lstat
        return pb.StatReply(inode=codec.inode_to_pb(await self._read(fn, self._caller(), path)))

    async def StatInode(self, request: pb.StatInodeRequest, context: Any) -> pb.StatReply:
        caller = self._caller()
        inode = await self._read(self.store.stat_inode, caller, request.inode_id,
                                 opened=self._opened(caller, request.inode_id, request.capability))
        return pb.StatReply(inode=codec.inode_to_pb(inode))

    async def Readdir(self, request: pb.ReaddirRequest, context: Any) -> pb.ReaddirReply:
        path = check_path(request.path)
        if request.limit > MAX_READDIR_LIMIT:
            raise FsInvalidArgument(f"readdir limit {request.limit} exceeds {MAX_READDIR_LIMIT}", path=path,
                                  limit=request.limit)
        limit = request.limit or DEFAULT_READDIR_LIMIT
        page = await self._read(self.store.readdir, self._caller(), path, after=request.after, limit=limit)
        return codec.page_to_pb(page)

    async def Rename(self, request: pb.RenameRequest, context: Any) -> pb.RenameReply:
        src, dst = check_path(request.src, "src"), check_path(request.dst, "dst")
        await self._write(self.store.rename, self._caller(), src, dst, request_id=request_id(request))
        return pb.RenameReply()

    async def Unlink(self, request: pb.UnlinkRequest, context: Any) -> pb.UnlinkReply:
        await self._write(self.store.unlink, self._caller(), check_path(request.path), request_id=request_id(request))
        return pb.UnlinkReply()

    async def Rmdir(self, request: pb.RmdirRequest, context: Any) -> pb.RmdirReply:
        await self._write(self.store.rmdir, self._caller(), check_path(request.path), request_id=request_id(request))
        return pb.RmdirReply()

    async def Symlink(self, request: pb.SymlinkRequest, context: Any) -> pb.SymlinkReply:
        link = check_path(request.link_path, "link_path")
        if not request.target or "\0" in request.target or len(request.target.encode()) > MAX_PATH:
            raise FsInvalidArgument(f"symlink target {request.target!r} is empty, has a NUL byte or is too long",
                                  path=link, target=request.target[:256])
        inode = await self._write(self.store.symlink, self._caller(), request.target, link,
                                request_id=request_id(request))
        return pb.SymlinkReply(inode=codec.inode_to_pb(inode))

    async def Readlink(self, request: pb.ReadlinkRequest, context: Any) -> pb.ReadlinkReply:
        target = await self._read(self.store.readlink, self._caller(), check_path(request.path))
        return pb.ReadlinkReply(target=target)

    async def Link(self, request: pb.LinkRequest, context: Any) -> pb.LinkReply:
        existing, new = check_path(request.existing, "existing"), check_path(request.new_path, "new_path")
        inode = await self._write(self.store.link, self._caller(), existing, new, request_id=request_id(request))
        return pb.LinkReply(inode=codec.inode_to_pb(inode))

    async def Truncate(self, request: pb.TruncateRequest, context: Any) -> pb.TruncateReply:
        path = check_path(request.path)
        inode = await self._write(self.store.truncate, self._caller(), path, request.length,
                                request_id=request_id(request))
        return pb.TruncateReply(inode=codec.inode_to_pb(inode))

    async def Setattr(self, request: pb.SetattrRequest, context: Any) -> pb.SetattrReply:
        path = check_path(request.path)

        def opt(name: str) -> Any:
            return getattr(request, name) if request.HasField(name) else None

        mode = opt("mode")
        if mode is not None:
            check_mode(mode, path)
        for name in ("atime", "mtime"):
            if request.HasField(name):
                check_time(getattr(request, name), name)
        uid, gid = opt("uid"), opt("gid")
        owner = opt("owner")
        if owner is not None:
            if uid is not None or gid is not None:
                raise FsInvalidArgument("give owner (a user name) or uid/gid, not both", path=path, owner=owner)
            if not owner or "\0" in owner:
                raise FsInvalidArgument(f"owner {owner!r} is not a user name", path=path, owner=owner[:64])
            ids = ids_for(owner, admin_role=False, table=self.users)
            uid, gid = ids.uid, ids.gid
        inode = await self._write(self.store.setattr, self._caller(), path, mode=mode, uid=uid,
                                gid=gid, atime=opt("atime"), mtime=opt("mtime"),
                                request_id=request_id(request))
        return pb.SetattrReply(inode=codec.inode_to_pb(inode))

    async def Statfs(self, request: pb.StatfsRequest, context: Any) -> pb.StatfsReply:
        return codec.statfs_to_pb(await self._run(self.store.statfs, self._caller()))

    async def ReportLength(self, request: pb.ReportLengthRequest, context: Any) -> pb.ReportLengthReply:
        inode = await self._write(self.store.report_length, self._caller(), request.inode_id, request.length)
        return pb.ReportLengthReply(inode=codec.inode_to_pb(inode))

    async def SetDirPolicy(self, request: pb.SetDirPolicyRequest, context: Any) -> pb.SetDirPolicyReply:
        path = check_path(request.path)
        policy = codec.policy_from_pb(request.policy) if request.HasField("policy") else None
        inode = await self._run_layout(self.store.set_dir_policy, self._caller(), path, policy,
                                       request_id=request_id(request))
        return pb.SetDirPolicyReply(inode=codec.inode_to_pb(inode))

    async def Endpoints(self, request: pb.EndpointsRequest, context: Any) -> pb.EndpointsReply:
        return pb.EndpointsReply(wire_address=self.wire_address)

    async def WhoAmI(self, request: pb.WhoAmIRequest, context: Any) -> pb.WhoAmIReply:
        """The caller, and its home (made here when missing: see fireflyer.meta.homes)."""
        who = current_principal()
        caller = self._caller()
        reply = pb.WhoAmIReply(user=who.user, roles=sorted(who.roles), uid=caller.uid, gid=caller.gid)
        implied = {r for r in ("admin", "user", "service") if who.has_role(r)}  # admin implies user
        if gets_home(implied) and valid_home_name(who.user):
            # the home belongs to the user's own ids (an admin's: root's)
            _, created = await self._write(self.store.ensure_home, who.user, caller.uid, caller.gid)
            reply.home = home_path(who.user)
            reply.home_created = created
        return reply
