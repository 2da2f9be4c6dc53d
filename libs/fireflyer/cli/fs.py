"""``ff fs``: the file-system namespace through the meta service.

    ff fs mkdir [-p] [-m MODE] PATH      ff fs mv SRC DST
    ff fs ls [-l] [PATH]                 ff fs rm [-r] PATH
    ff fs stat [--json] PATH             ff fs ln [-s] TARGET LINK
    ff fs put LOCAL PATH                 ff fs get PATH LOCAL
    ff fs cat PATH                       ff fs du [-s] PATH
    ff fs cp SRC DST                     ff fs chmod MODE PATH
    ff fs chown USER PATH  (admin)       ff whoami [--json]

A PATH without a leading ``/`` is relative to your home ``/home/<user>`` (HDFS-like:
``ff fs put x.bin data/x.bin`` writes ``/home/<user>/data/x.bin``; ``ff fs ls`` lists
the home).  Meta makes the home on first use; ``ff whoami`` prints user, roles, home.
``mkdir -p -m MODE`` on an existing directory of another mode fails with EEXIST
naming its mode (change it with ``ff fs chmod``) rather than succeed silently.

put/get/cat/cp move file data through the storage nodes (mgmtd is found through
``FF_MGMTD_ADDR`` or cluster.json); ``-`` as LOCAL is stdin/stdout.

Where to: ``--address host:port[,host:port...]``, else ``FF_META_ADDR``, else the
meta replicas of the local cluster in ``--state-dir`` / ``FF_STATE_DIR`` / ``.ff``
(``ff up``'s ``cluster.json``).  Who: ``--token``, else ``FF_TOKEN``, else the state dir's
token for ``--role`` (``user`` by default; ``admin`` acts as root).  Errors
print the errno and path the service reported and exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import stat as statmod
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

__all__ = ["register", "resolve_meta", "whoami_text"]


def resolve_meta(state_dir: Path | str | None, *, address: str | None, token: str | None,
                 role: str) -> tuple[list[str], str]:
    """(meta addresses, token) by :func:`fireflyer.cluster.discovery.find_cluster`'s precedence:
    explicit values, then FF_META_ADDR / FF_TOKEN, then the cluster of ``state_dir`` (None:
    FF_STATE_DIR, else .ff) and its ``role`` token; NoClusterFound says how to point at one."""
    from fireflyer.cluster.discovery import find_cluster

    c = find_cluster(state_dir, meta=address, token=token, role=role, need=("meta", "token"))
    assert c.token is not None
    return list(c.meta), c.token


# --------------------------------------------------------------------------- output


def _mode_string(inode: Any) -> str:
    from fireflyer.meta import FileType

    kind = {FileType.DIR: statmod.S_IFDIR, FileType.SYMLINK: statmod.S_IFLNK}.get(inode.type, statmod.S_IFREG)
    return statmod.filemode(kind | inode.mode)


def _when(t: Any, fmt: str) -> str:
    """A stored time in local time; a time no calendar can show (NaN, inf, 1e300: stored
    before meta checked times) is printed raw instead of failing the whole listing."""
    try:
        return time.strftime(fmt, time.localtime(t))
    except (OverflowError, ValueError, OSError, TypeError):
        return repr(t)


def _long_line(name: str, inode: Any) -> str:
    when = _when(inode.mtime, "%Y-%m-%d %H:%M")
    suffix = f" -> {inode.target}" if inode.target else ""
    return f"{_mode_string(inode)} {inode.nlink:>3} {inode.uid:>7} {inode.gid:>7} {inode.length:>12} {when} {name}{suffix}"


def _print_stat(path: str, inode: Any, as_json: bool) -> None:
    import msgspec

    if as_json:
        print(msgspec.json.encode(inode).decode())
        return
    rows = [("path", path), ("inode", inode.id), ("type", inode.type.value), ("mode", f"{inode.mode:04o} "
            f"({_mode_string(inode)})"), ("uid", inode.uid), ("gid", inode.gid), ("nlink", inode.nlink),
            ("length", inode.length)]
    for name in ("atime", "mtime", "ctime"):
        rows.append((name, _when(getattr(inode, name), "%Y-%m-%d %H:%M:%S")))
    if inode.target:
        rows.append(("target", inode.target))
    if inode.layout is not None:
        lay = inode.layout
        rows.append(("layout", f"table {lay.chain_table_id} v{lay.chain_table_version}, chunk {lay.chunk_size}, "
                               f"stripe {lay.stripe_size}, chains {list(lay.chains)}"))
    if inode.dir_policy is not None:
        pol = inode.dir_policy
        rows.append(("policy", f"table {pol.chain_table_id}, chunk {pol.chunk_size}, stripe {pol.stripe_size}"))
    for k, v in rows:
        print(f"{k:>7}: {v}")


# --------------------------------------------------------------------------- commands


def _octal(text: str) -> int:
    from fireflyer.core.errors import InvalidArgument

    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise InvalidArgument(f"mode {text!r} is not octal permission bits like 755 or 0700", mode=text)
    return mode


async def _mkdir(meta: Any, ns: argparse.Namespace) -> int:
    from fireflyer.core.errors import FsError

    mode = _octal(ns.mode or "755")
    inode = await meta.mkdir(ns.path, mode, parents=ns.parents)
    if ns.parents and ns.mode is not None and inode.mode != mode:
        # -p returns an existing directory as it is: with an explicit -m, another mode is an error
        path = await meta.abspath(ns.path)
        raise FsError(f"{path} exists with mode {inode.mode:04o}, not {mode:04o}: change it with "
                      f"`ff fs chmod {mode:o} {ns.path}`", errno=errno.EEXIST, path=path, mode=f"{inode.mode:04o}")
    return 0


async def _chmod(meta: Any, ns: argparse.Namespace) -> int:
    await meta.setattr(ns.path, mode=_octal(ns.mode))
    return 0


async def _chown(meta: Any, ns: argparse.Namespace) -> int:
    await meta.setattr(ns.path, owner=ns.user)
    return 0


def whoami_text(ident: Any) -> str:
    """``ff whoami``'s lines: user, roles (comma separated), home ("-" for none)."""
    return f"user:  {ident.user}\nroles: {','.join(ident.roles) or '-'}\nhome:  {ident.home or '-'}"


async def _whoami(meta: Any, ns: argparse.Namespace) -> int:
    import msgspec

    ident = await meta.whoami()
    if ns.json:
        print(msgspec.json.encode({"user": ident.user, "roles": list(ident.roles), "home": ident.home,
                                   "uid": ident.uid, "gid": ident.gid}).decode())
    else:
        print(whoami_text(ident))
    return 0


async def _ls(meta: Any, ns: argparse.Namespace) -> int:
    from fireflyer.meta import FileType

    inode = await meta.stat(ns.path)
    if inode.type is not FileType.DIR:
        print(_long_line(ns.path, await meta.lstat(ns.path)) if ns.long else ns.path)
        return 0
    base = ns.path.rstrip("/")
    async for entry in meta.iterdir(ns.path):
        if ns.long:
            print(_long_line(entry.name, await meta.lstat(f"{base}/{entry.name}")))
        else:
            print(entry.name + ("/" if entry.type is FileType.DIR else ""))
    return 0


async def _stat(meta: Any, ns: argparse.Namespace) -> int:
    _print_stat(ns.path, await meta.lstat(ns.path), ns.json)
    return 0


async def _mv(meta: Any, ns: argparse.Namespace) -> int:
    await meta.rename(ns.src, ns.dst)
    return 0


async def _remove_tree(meta: Any, path: str) -> None:
    """``rm -r``: iterative (a stack of directories, deepest on top), so no tree depth can
    exhaust Python's recursion limit.  A directory is read from its first page each time it
    is on top (removing entries shifts later pages): its files are unlinked and its
    subdirectories go on the stack; once a read finds it empty it is removed."""
    from fireflyer.meta import FileType

    stack = [path]
    while stack:
        top = stack[-1]
        page = await meta.readdir(top)
        if not page.entries:
            await meta.rmdir(top)
            stack.pop()
            continue
        for entry in page.entries:
            child = f"{top.rstrip('/')}/{entry.name}"
            if entry.type is FileType.DIR:
                stack.append(child)
            else:
                await meta.unlink(child)


async def _rm(meta: Any, ns: argparse.Namespace) -> int:
    from fireflyer.meta import FileType

    inode = await meta.lstat(ns.path)
    if inode.type is FileType.DIR:
        if not ns.recursive:
            await meta.rmdir(ns.path)  # the service says ENOTEMPTY when it is not empty
        else:
            await _remove_tree(meta, ns.path)
    else:
        await meta.unlink(ns.path)
    return 0


async def _ln(meta: Any, ns: argparse.Namespace) -> int:
    if ns.symbolic:
        await meta.symlink(ns.target, ns.link)
    else:
        await meta.link(ns.target, ns.link)
    return 0


def _run(op: Callable[[Any, argparse.Namespace], Awaitable[int]]) -> Callable[[argparse.Namespace], int]:
    def handler(ns: argparse.Namespace) -> int:
        from fireflyer.fs import MetaClient

        addresses, token = resolve_meta(ns.state_dir, address=ns.address, token=ns.token, role=ns.role)

        async def go() -> int:
            async with await MetaClient.connect(addresses, token, failover_timeout_s=ns.timeout) as meta:
                return await op(meta, ns)

        return asyncio.run(go())

    return handler


# --------------------------------------------------------------------------- data commands

_STEP = 4 << 20


def _put(fs: Any, ns: argparse.Namespace) -> int:
    import sys

    src = sys.stdin.buffer if ns.local == "-" else open(ns.local, "rb")  # noqa: SIM115
    try:
        with fs.open(ns.path, "wb") as dst:
            while block := src.read(_STEP):
                dst.write(block)
    finally:
        if src is not sys.stdin.buffer:
            src.close()
    return 0


def _copy_out(fs: Any, path: str, out: Any) -> None:
    with fs.open(path, "rb", buffering=0) as src:
        off, size = 0, src.size()
        while off < size:
            block = src.pread(min(_STEP, size - off), off)
            if not block:
                break
            out.write(block)
            off += len(block)


def _get(fs: Any, ns: argparse.Namespace) -> int:
    import sys

    if ns.local == "-":
        _copy_out(fs, ns.path, sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return 0
    local = Path(ns.local)
    if local.is_dir():
        local = local / ns.path.rstrip("/").rsplit("/", 1)[-1]
    tmp = local.with_name(f".{local.name}.ff-partial")
    with open(tmp, "wb") as out:  # a failed get leaves no half-written file under the real name
        _copy_out(fs, ns.path, out)
    tmp.replace(local)
    return 0


def _cat(fs: Any, ns: argparse.Namespace) -> int:
    import sys

    for path in ns.paths:
        _copy_out(fs, path, sys.stdout.buffer)
    sys.stdout.buffer.flush()
    return 0


def _du(fs: Any, ns: argparse.Namespace) -> int:
    from fireflyer.meta import FileType

    inode = fs.lstat(ns.path)
    if ns.summarize or inode.type is not FileType.DIR:
        print(f"{fs.du(ns.path)}\t{ns.path}")
        return 0
    base = ns.path.rstrip("/")
    for entry in fs.listdir(ns.path):
        print(f"{fs.du(f'{base}/{entry.name}')}\t{base}/{entry.name}")
    print(f"{fs.du(ns.path)}\t{ns.path}")
    return 0


def _cp(fs: Any, ns: argparse.Namespace) -> int:
    from fireflyer.meta import FileType

    dst = ns.dst
    if fs.exists(dst) and fs.stat(dst).type is FileType.DIR:
        dst = f"{dst.rstrip('/')}/{ns.src.rstrip('/').rsplit('/', 1)[-1]}"
    with fs.open(ns.src, "rb", buffering=0) as src, fs.open(dst, "wb", buffering=0) as out:
        off, size = 0, src.size()
        while off < size:
            block = src.pread(min(_STEP, size - off), off)
            if not block:
                break
            out.pwrite(block, off)
            off += len(block)
    return 0


def _run_data(op: Callable[[Any, argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def handler(ns: argparse.Namespace) -> int:
        from fireflyer.fs import connect

        addresses, token = resolve_meta(ns.state_dir, address=ns.address, token=ns.token, role=ns.role)
        with connect(meta=addresses, token=token, state_dir=ns.state_dir) as fs:
            return op(fs, ns)

    return handler


def register(subparsers: Any) -> None:
    from fireflyer.cli.options import add_cluster_options

    fs = subparsers.add_parser("fs", help="file-system namespace operations through the meta service",
                               description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = fs.add_subparsers(dest="fs_command", metavar="OP", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        add_cluster_options(p, address_help="meta host:port[,host:port...] (default $FF_META_ADDR, else "
                                            "cluster.json)", role="user")
        p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="give up on unreachable replicas after S")

    p = sub.add_parser("mkdir", help="make a directory")
    p.add_argument("-p", "--parents", action="store_true", help="make parents as needed; no error if it exists")
    p.add_argument("-m", "--mode", default=None, help="permission bits in octal (default 755); with -p an "
                   "existing directory of another mode is an error (EEXIST)")
    p.add_argument("path")
    p.set_defaults(func=_run(_mkdir))

    p = sub.add_parser("ls", help="list a directory")
    p.add_argument("-l", dest="long", action="store_true", help="long format: mode, links, uid, gid, size, mtime")
    p.add_argument("path", nargs="?", default=".", help="default: your home")
    p.set_defaults(func=_run(_ls))

    p = sub.add_parser("stat", help="show an inode (symlinks not followed)")
    p.add_argument("--json", action="store_true", help="print the inode as JSON")
    p.add_argument("path")
    p.set_defaults(func=_run(_stat))

    p = sub.add_parser("mv", help="rename (atomically replaces a file or an empty directory at DST)")
    p.add_argument("src")
    p.add_argument("dst")
    p.set_defaults(func=_run(_mv))

    p = sub.add_parser("rm", help="remove a file, symlink or empty directory (-r: a whole tree)")
    p.add_argument("-r", "--recursive", action="store_true")
    p.add_argument("path")
    p.set_defaults(func=_run(_rm))

    p = sub.add_parser("ln", help="make a hard link (-s: a symbolic link) LINK to TARGET")
    p.add_argument("-s", "--symbolic", action="store_true")
    p.add_argument("target")
    p.add_argument("link")
    p.set_defaults(func=_run(_ln))

    p = sub.add_parser("put", help="copy a local file (- = stdin) into the file system")
    p.add_argument("local")
    p.add_argument("path")
    p.set_defaults(func=_run_data(_put))

    p = sub.add_parser("get", help="copy a file to a local file or directory (- = stdout)")
    p.add_argument("path")
    p.add_argument("local")
    p.set_defaults(func=_run_data(_get))

    p = sub.add_parser("cat", help="print files' bytes to stdout")
    p.add_argument("paths", nargs="+")
    p.set_defaults(func=_run_data(_cat))

    p = sub.add_parser("du", help="bytes used by a file or each entry of a directory (-s: the total only)")
    p.add_argument("-s", "--summarize", action="store_true")
    p.add_argument("path")
    p.set_defaults(func=_run_data(_du))

    p = sub.add_parser("cp", help="copy a file inside the file system (into DST if it is a directory)")
    p.add_argument("src")
    p.add_argument("dst")
    p.set_defaults(func=_run_data(_cp))

    p = sub.add_parser("chmod", help="set permission bits (the owner or an admin)")
    p.add_argument("mode", help="octal, e.g. 750")
    p.add_argument("path")
    p.set_defaults(func=_run(_chmod))

    p = sub.add_parser("chown", help="give PATH to USER (its uid and gid); admin only (use --role admin)")
    p.add_argument("user")
    p.add_argument("path")
    p.set_defaults(func=_run(_chown))

    for action in sub.choices.values():
        common(action)

    p = subparsers.add_parser("whoami", help="who your token is: user, roles, home (made on first use)")
    p.add_argument("--json", action="store_true", help="one JSON object: user, roles, home, uid, gid")
    p.set_defaults(func=_run(_whoami))
    common(p)
