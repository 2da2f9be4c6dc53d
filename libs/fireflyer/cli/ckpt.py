"""``ff ckpt``: the checkpoint catalog of the checkpoint service.

    ff ckpt jobs [--json]                                  your jobs that have checkpoints (an admin: every job)
    ff ckpt ls JOB [--all] [--json]                        a job's committed checkpoints (--all: also pending/aborted)
    ff ckpt show ID [--json] [--local-root DIR]            one checkpoint: record, per-rank shards, tensors
    ff ckpt rm ID [--force]                                delete it (--force: even when pinned)
    ff ckpt pin ID | ff ckpt unpin ID                      keep it whatever the retention policy says
    ff ckpt retention JOB [--keep-last N] [--keep-every K] show, or set, the job's retention policy

The address is ``--address``, else ``FF_CKPT_ADDR``, else the checkpoint service of the local
cluster's ``cluster.json`` (``ff up``; ``--state-dir``, else ``FF_STATE_DIR``, else ``.ff``); the token ``--token``, else ``FF_TOKEN``, else the
cluster's user token.  A job belongs to the user who first saved to it: only that user or an admin
may list, show, pin, retain or delete its checkpoints.  ``show`` lists tensors by reading each rank's index from the file system:
3FS through ``FF_META_ADDR``/``FF_MGMTD_ADDR`` or the local cluster, or ``--local-root`` (also
``FF_CHECKPOINT_LOCAL_ROOT``) when the service keeps checkpoints in a local directory.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["register", "resolve_ckpt", "ls_table", "show_text", "read_tensors_of"]


def resolve_ckpt(state_dir: Path | str | None, *, address: str | None, token: str | None) -> tuple[str, str | None]:
    """(checkpoint service address, token) by ``find_cluster``'s precedence (``--address``,
    FF_CKPT_ADDR, the cluster of ``state_dir`` / FF_STATE_DIR / .ff; the user token)."""
    from fireflyer.cluster.discovery import find_cluster

    c = find_cluster(state_dir, ckpt=address, token=token, need=("ckpt",))
    return c.ckpt[0], c.token


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t > 0 else "-"


def ls_table(recs: list[Any]) -> str:
    if not recs:
        return "no checkpoints"
    rows = [[r.id, r.step, r.state.value, f"{r.ranks_committed}/{r.world_size}", _size(r.nbytes),
             _when(r.committed_at), "yes" if r.pinned else "-"] for r in recs]
    return _table(["ID", "STEP", "STATE", "RANKS", "SIZE", "COMMITTED", "PINNED"], rows)


def _dtype_name(kind: str, dtype: str) -> str:
    """numpy entries record ``dtype.str`` (``<f4``); people read ``float32``."""
    if kind == "torch":
        return dtype
    try:
        from fireflyer.ckpt.state import numpy_dtype

        return str(numpy_dtype(dtype).name)
    except (TypeError, ValueError):
        return dtype


def read_tensors_of(rec: Any, fs: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Tensor rows (rank, path, dtype, shape, nbytes) from each rank's index in ``fs``, and problems."""
    from fireflyer.ckpt.index import TensorEntry, decode_index, index_name
    from fireflyer.core.errors import FireFlyerError

    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for rank in range(rec.world_size):
        path = f"{rec.directory.rstrip('/')}/{index_name(rank)}"
        try:
            index = decode_index(fs.read_bytes(path))
        except FireFlyerError as e:
            problems.append(f"rank {rank}: cannot read {path}: {e}")
            continue
        rows += [{"rank": rank, "path": e.path, "kind": e.kind, "dtype": _dtype_name(e.kind, e.dtype),
                  "shape": list(e.shape), "nbytes": e.nbytes}
                 for e in index.entries if isinstance(e, TensorEntry)]
    return rows, problems


def _open_fs(ns: argparse.Namespace) -> tuple[Any, str]:
    """The file system the checkpoint data is in, or (None, why not)."""
    local_root = ns.local_root or os.environ.get("FF_CHECKPOINT_LOCAL_ROOT")
    if local_root:
        from fireflyer.ckpt.localfs import LocalFS

        return LocalFS(local_root), ""
    try:
        from fireflyer.fs import connect

        return connect(token=ns.token, state_dir=ns.state_dir), ""
    except Exception as e:  # noqa: BLE001 - the record is still worth showing
        return None, f"tensors cannot be listed: no file system reachable ({e})"


def show_text(rec: Any, shards: list[Any], tensors: list[dict[str, Any]] | None, problems: list[str]) -> str:
    out = [f"checkpoint {rec.id}: job {rec.job} step {rec.step}, {rec.state.value}"
           + (" (pinned)" if rec.pinned else ""),
           f"directory:  {rec.directory}",
           *([f"owner:      {rec.owner}"] if rec.owner else []),
           f"ranks:      {rec.ranks_committed}/{rec.world_size} committed, {_size(rec.nbytes)}",
           f"created:    {_when(rec.created_at)}   committed: {_when(rec.committed_at)}"]
    if rec.reason:
        out.append(f"reason:     {rec.reason}")
    if rec.meta:
        out.append("meta:       " + ", ".join(f"{k}={v}" for k, v in sorted(rec.meta.items())))
    out.append("")
    out.append(_table(["RANK", "INDEX_DIGEST", "SIZE", "COMMITTED"],
                      [[s.rank, s.index_digest, _size(s.nbytes), _when(s.committed_at)] for s in shards])
               if shards else "no shards committed")
    if tensors is not None:
        out.append("")
        out.append(_table(["RANK", "TENSOR", "DTYPE", "SHAPE", "BYTES"],
                          [[t["rank"], t["path"], t["dtype"], "x".join(map(str, t["shape"])) or "()", t["nbytes"]]
                           for t in tensors]) if tensors else "no tensors")
    out += problems
    return "\n".join(out)


def _run(ns: argparse.Namespace) -> int:
    from fireflyer.ckpt.client import CheckpointClient
    from fireflyer.ckpt.model import RetentionPolicy

    address, token = resolve_ckpt(ns.state_dir, address=ns.address, token=ns.token)
    dump = (lambda obj: print(json.dumps(msgspec.to_builtins(obj)))) if getattr(ns, "json", False) else None
    with CheckpointClient(address, token=token or "") as c:
        cmd = ns.ckpt_cmd
        if cmd == "jobs":
            jobs = c.jobs()
            (dump(jobs) if dump else print("\n".join(jobs) if jobs else "no jobs"))
        elif cmd == "ls":
            recs = c.list(ns.job, include_all=ns.all)
            (dump(recs) if dump else print(ls_table(recs)))
        elif cmd == "show":
            rec = c.get(ns.id)
            shards = c.shards(ns.id)
            fs, why = _open_fs(ns)
            tensors, problems = (None, [why]) if fs is None else read_tensors_of(rec, fs)
            if fs is not None and hasattr(fs, "close"):
                fs.close()
            if dump:
                dump({"checkpoint": rec, "shards": shards, "tensors": tensors, "problems": problems})
            else:
                print(show_text(rec, shards, tensors, problems))
        elif cmd == "rm":
            rec = c.delete(ns.id, force=ns.force)
            print(f"deleted {rec.id} (job {rec.job} step {rec.step})")
        elif cmd in ("pin", "unpin"):
            rec = c.pin(ns.id, cmd == "pin")
            print(f"{rec.id} (job {rec.job} step {rec.step}): {'pinned' if rec.pinned else 'unpinned'}")
        else:
            policy = c.retention(ns.job)
            if ns.keep_last is not None or ns.keep_every is not None:
                policy = c.set_retention(ns.job, RetentionPolicy(
                    keep_last=policy.keep_last if ns.keep_last is None else ns.keep_last,
                    keep_every=policy.keep_every if ns.keep_every is None else ns.keep_every))
            if dump:
                dump(policy)
            else:
                print(f"{ns.job}: keep the last {policy.keep_last or 'all'}"
                      + (f", every step multiple of {policy.keep_every}" if policy.keep_every else "")
                      + ", and pinned ones")
    return 0


def register(subparsers: Any) -> None:
    from fireflyer.cli.options import add_cluster_options

    p = subparsers.add_parser("ckpt", help="checkpoints: list, show, delete, pin, retention",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_options(p, address_help="checkpoint service host:port (default $FF_CKPT_ADDR, else the "
                                        "cluster's)")
    sub = p.add_subparsers(dest="ckpt_cmd", metavar="WHAT", required=True)
    jobs = sub.add_parser("jobs", help="jobs with checkpoints")
    jobs.add_argument("--json", action="store_true")
    ls = sub.add_parser("ls", help="a job's checkpoints")
    ls.add_argument("job")
    ls.add_argument("--all", action="store_true", help="also pending, committing and aborted ones")
    ls.add_argument("--json", action="store_true")
    show = sub.add_parser("show", help="one checkpoint: record, shards and tensors")
    show.add_argument("id")
    show.add_argument("--json", action="store_true")
    show.add_argument("--local-root", default=None,
                      help="the service's local checkpoint directory (when it runs without 3FS)")
    rm = sub.add_parser("rm", help="delete a checkpoint (records and files)")
    rm.add_argument("id")
    rm.add_argument("--force", action="store_true", help="delete even when pinned")
    for name, what in (("pin", "keep a checkpoint whatever the retention"), ("unpin", "let retention delete it")):
        sp = sub.add_parser(name, help=what)
        sp.add_argument("id")
    ret = sub.add_parser("retention", help="show or set a job's retention policy")
    ret.add_argument("job")
    ret.add_argument("--keep-last", type=int, default=None, help="keep the newest N committed (0: all)")
    ret.add_argument("--keep-every", type=int, default=None, help="also keep steps that are multiples of K (0: none)")
    ret.add_argument("--json", action="store_true")
    p.set_defaults(func=_run)
