"""``ff bench meta``: metadata ops/s through the meta service, with the local file system as anchor.

    ff bench meta --clients 8 --ops create,stat,rename,readdir --json [--pg-dsn DSN]

What is measured is what users get: the full service path.  For each backend
(SQLite always; PostgreSQL when ``--pg-dsn`` or ``FF_TEST_PG_DSN`` is given) the
bench starts ``--replicas`` meta processes (``python -m services.meta``; default 2,
as ``deploy/local.toml`` runs them, all on one KV) on a temp state dir, exactly as
``ff up`` configures them (auth, span file, JSON logs, default trace sampling),
and ``--clients`` clients (one ``MetaClient`` each, one call in flight; over each replica's
wire endpoint as MetaClient does by default, or gRPC with ``--transport grpc``; ``--transport
both`` runs the service twice, the gRPC figures under ``"grpc"``) spread over
``--client-procs`` processes.  The default is one process per 4 clients (2 for 8):
a meta service's clients are FUSE daemons and training processes that each carry
several concurrent callers, and on a small machine a process per client mostly
measures 8 event loops competing with the servers for 2 cores.  The JSON says how
many replicas and client processes were used.  The ops run in phases separated
by a barrier:

- ``create``: ``create(O_CREAT|O_EXCL)`` of ``--count`` new files in the client's
  own directory; ``stat``: stat each; ``rename``: rename each within the directory;
  ``readdir``: read the first page (128 entries) of the directory, ``--count`` times;
  ``unlink`` (optional): remove each.

A phase's rate is all clients' ops divided by the phase's wall time (first start to
last end).  The anchor is the same op mix on the local file system (``os.open``
O_CREAT|O_EXCL + close, ``os.stat``, ``os.rename``, one ``os.scandir`` page,
``os.unlink``) from as many threads, measured in the same run.  Before the first phase each
client makes ``WARMUP_CALLS`` untimed stats (connections to every replica open, the
servers' code paths run once).  ``creates_stats_per_s``
is (creates + stats) / (create time + stat time), the figure the goal names
(>= 2,000/s with SQLite and 8 clients).  Quote ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from fireflyer.bench._jsonout import add_json_option, emit

__all__ = ["main", "run_bench", "bench_local_fs", "bench_service", "ALL_OPS", "GOAL_CREATES_STATS_PER_S"]

ALL_OPS = ("mkdir", "create", "stat", "rename", "readdir", "unlink")
GOAL_CREATES_STATS_PER_S = 2000.0
PAGE = 128
#: deploy/local.toml runs two meta replicas
DEFAULT_REPLICAS = 2
#: concurrent callers per client process when --client-procs is not given
CLIENTS_PER_PROC = 4
#: untimed stats of its own directory each client makes before the timed phases
WARMUP_CALLS = 25


def default_client_procs(clients: int) -> int:
    return max(1, -(-clients // CLIENTS_PER_PROC))


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _rates(spans: dict[str, list[tuple[float, float]]], count: int) -> dict[str, float]:
    """ops/s per op from each client's (start, end) of that phase."""
    out = {}
    for op, intervals in spans.items():
        wall = max(e for _, e in intervals) - min(s for s, _ in intervals)
        out[op] = round(count * len(intervals) / wall, 1) if wall > 0 else float("inf")
    return out


def _combined(spans: dict[str, list[tuple[float, float]]], count: int) -> float | None:
    if "create" not in spans or "stat" not in spans:
        return None
    walls = [max(e for _, e in spans[op]) - min(s for s, _ in spans[op]) for op in ("create", "stat")]
    return round(2 * count * len(spans["create"]) / sum(walls), 1)


# --------------------------------------------------------------------------- anchor


def _threaded_phases(clients: int, ops: Sequence[str], count: int, setup: Callable[[int], None],
                     do: Callable[[int, str, int], None]) -> dict[str, list[tuple[float, float]]]:
    """Run the phases with one thread per client; (start, end) of each client's timed phases."""
    barrier = threading.Barrier(clients)
    spans: dict[str, list[tuple[float, float]]] = {op: [] for op in ops}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            setup(i)
            for op in ALL_OPS:
                timed = op in ops
                if not timed and op not in ("create", "rename"):
                    continue
                barrier.wait()
                t0 = time.perf_counter()
                for j in range(count):
                    do(i, op, j)
                t1 = time.perf_counter()
                if timed:
                    with lock:
                        spans[op].append((t0, t1))
        except BaseException as e:  # reported, not swallowed
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return spans


def bench_local_fs(root: Path, *, clients: int, ops: Sequence[str], count: int) -> dict[str, Any]:
    """The op mix on the local file system with ``clients`` threads (the anchor)."""

    def setup(i: int) -> None:
        (root / f"c{i}").mkdir(parents=True)

    def do(i: int, op: str, j: int) -> None:
        base = f"{root}/c{i}"
        if op == "mkdir":
            os.mkdir(f"{base}/d{j}")
        elif op == "create":
            os.close(os.open(f"{base}/f{j}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        elif op == "stat":
            os.stat(f"{base}/f{j}")
        elif op == "rename":
            os.rename(f"{base}/f{j}", f"{base}/g{j}")
        elif op == "readdir":
            with os.scandir(base) as it:
                for _ in itertools.islice(it, PAGE):
                    pass
        elif op == "unlink":
            os.unlink(f"{base}/g{j}")

    spans = _threaded_phases(clients, ops, count, setup, do)
    return {"path": str(root), "ops_per_s": _rates(spans, count), "creates_stats_per_s": _combined(spans, count)}


def bench_store_direct(kv_url: str, *, clients: int, ops: Sequence[str], count: int) -> dict[str, Any]:
    """The op mix on ``MetaStore`` in this process with ``clients`` threads: the library and KV
    without gRPC, i.e. the ceiling the service path is measured against (not the anchor)."""
    from fireflyer.kv import open_kv
    from fireflyer.meta import Caller, MetaStore, StaticChainTables

    kv = open_kv(kv_url)
    try:
        MetaStore.init(kv)
        store = MetaStore(kv, tables=StaticChainTables({1: (1, tuple(range(1, 17)))}))
        who = Caller(0, 0, admin=True)
        store.mkdir(who, "/direct")

        def setup(i: int) -> None:
            store.mkdir(who, f"/direct/c{i}")

        def do(i: int, op: str, j: int) -> None:
            base = f"/direct/c{i}"
            rid = os.urandom(16)  # as MetaClient sends with every mutation
            if op == "mkdir":
                store.mkdir(who, f"{base}/d{j}", request_id=rid)
            elif op == "create":
                store.create(who, f"{base}/f{j}", flags=os.O_CREAT | os.O_EXCL | os.O_WRONLY, request_id=rid)
            elif op == "stat":
                store.stat(who, f"{base}/f{j}")
            elif op == "rename":
                store.rename(who, f"{base}/f{j}", f"{base}/g{j}", request_id=rid)
            elif op == "readdir":
                store.readdir(who, base, limit=PAGE)
            elif op == "unlink":
                store.unlink(who, f"{base}/g{j}", request_id=rid)

        spans = _threaded_phases(clients, ops, count, setup, do)
    finally:
        kv.close()
    return {"ops_per_s": _rates(spans, count), "creates_stats_per_s": _combined(spans, count)}


# --------------------------------------------------------------------------- service


async def _one_client(i: int, meta: Any, op: str, count: int) -> tuple[float, float]:
    """One client's phase: ``count`` calls of ``op``, one in flight; returns (start, end)."""
    base = f"/bench/c{i}"
    t0 = time.perf_counter()
    for j in range(count):
        if op == "mkdir":
            await meta.mkdir(f"{base}/d{j}")
        elif op == "create":
            await meta.create(f"{base}/f{j}", flags=os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        elif op == "stat":
            await meta.stat(f"{base}/f{j}")
        elif op == "rename":
            await meta.rename(f"{base}/f{j}", f"{base}/g{j}")
        elif op == "readdir":
            await meta.readdir(base, limit=PAGE)
        elif op == "unlink":
            await meta.unlink(f"{base}/g{j}")
    return t0, time.perf_counter()


def _client_proc(ids: list[int], addresses: list[str], token: str, ops: list[str], count: int, barrier: Any,
                 results: Any, transport: str = "auto") -> None:
    """A client process hosting clients ``ids``: each its own MetaClient (own channels), phases in
    ALL_OPS order, all processes starting each phase together."""

    async def run() -> dict[int, dict[str, tuple[float, float]]]:
        from fireflyer.fs import MetaClient

        out: dict[int, dict[str, Any]] = {i: {} for i in ids}
        metas = [await MetaClient.connect(addresses, token, transport=transport) for _ in ids]
        try:
            for i, meta in zip(ids, metas, strict=True):
                await meta.mkdir(f"/bench/c{i}")
            # untimed warm-up: every client's channels to every replica are open and each
            # server has run the calls once before the first timed phase
            await asyncio.gather(*(meta.stat(f"/bench/c{i}") for i, meta in zip(ids, metas, strict=True)
                                   for _ in range(WARMUP_CALLS)))
            for op in ALL_OPS:
                timed = op in ops
                if not timed and op not in ("create", "rename"):
                    continue
                await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
                spans = await asyncio.gather(*(_one_client(i, m, op, count) for i, m in zip(ids, metas, strict=True)))
                if timed:
                    for i, span in zip(ids, spans, strict=True):
                        out[i][op] = span
            for i, meta in zip(ids, metas, strict=True):  # how the calls went: "wire" or "grpc"
                out[i]["transport"] = sorted({t.split()[0] for t in meta.transports().values()})
        finally:
            for meta in metas:
                await meta.close()
        return out

    try:
        results.put((asyncio.run(run()), None))
    except BaseException as e:  # noqa: BLE001 - the parent reports it
        barrier.abort()
        results.put(({}, repr(e)))


def bench_service(kv_url: str, state_dir: Path, *, clients: int, ops: Sequence[str], count: int,
                  replicas: int = DEFAULT_REPLICAS, client_procs: int | None = None,
                  env: dict[str, str] | None = None, transport: str = "auto") -> dict[str, Any]:
    """Start ``replicas`` meta processes on ``kv_url`` and drive them with ``clients`` clients
    spread over ``client_procs`` processes (default: :func:`default_client_procs`)."""
    from fireflyer.rpc import TokenEntry, generate_token, write_tokens_file
    from fireflyer.testing.services import ServiceProcess

    state_dir.mkdir(parents=True, exist_ok=True)
    admin, user = generate_token(), generate_token()
    tokens = write_tokens_file(state_dir / "tokens.json", [TokenEntry(token=admin, user="admin", roles=["admin"]),
                                                          TokenEntry(token=user, user="bench", roles=["user"])])
    procs = [ServiceProcess("services.meta", state_dir=state_dir, nats_url="", tokens_file=tokens,
                            instance=f"meta-{r}", env={"FF_META_KV_URL": kv_url, "FF_LOG_FORMAT": "json",
                                                       "FF_TOKEN": admin, **(env or {})}) for r in range(replicas)]
    try:
        for p in procs:
            p.start()

        async def prepare() -> None:
            from fireflyer.fs import MetaClient

            for p in procs:
                await p.wait_healthy(timeout_s=60.0)
            async with await MetaClient.connect([p.address for p in procs], admin) as meta:
                await meta.mkdir("/bench", 0o777)

        asyncio.run(prepare())
        server_cpu0 = [_proc_cpu_s(p.pid) for p in procs]
        clients_cpu0 = _children_cpu_s()
        ctx = mp.get_context("spawn")
        nprocs = min(client_procs or default_client_procs(clients), clients)
        barrier = ctx.Barrier(nprocs)
        results = ctx.Queue()
        addresses = [p.address for p in procs]
        groups = [list(range(clients))[k::nprocs] for k in range(nprocs)]
        workers = [ctx.Process(target=_client_proc,
                               args=(g, addresses, user, list(ops), count, barrier, results, transport))
                   for g in groups]
        for w in workers:
            w.start()
        got = [results.get(timeout=600) for _ in workers]
        for w in workers:
            w.join(timeout=30)
        server_cpu = sum(_proc_cpu_s(p.pid) - c for p, c in zip(procs, server_cpu0, strict=True))
        clients_cpu = _children_cpu_s() - clients_cpu0
        failed = [err for _, err in got if err]
        if failed:
            raise RuntimeError(f"{len(failed)} bench clients failed; first: {failed[0]}\n{procs[0].log()[-2000:]}")
        spans: dict[str, list[tuple[float, float]]] = {op: [] for op in ops}
        used: set[str] = set()
        for per_client, _ in got:
            for per_op in per_client.values():
                used.update(per_op.pop("transport", ()))
                for op, span in per_op.items():
                    spans[op].append(span)
        # on a small machine clients and servers share the cores: say who used them
        return {"replicas": replicas, "client_processes": nprocs, "transport": ",".join(sorted(used)),
                "ops_per_s": _rates(spans, count),
                "creates_stats_per_s": _combined(spans, count),
                "cpu_s": {"meta_servers": round(server_cpu, 2), "clients": round(clients_cpu, 2)}}
    finally:
        for p in procs:
            p.stop()


def _proc_cpu_s(pid: int) -> float:
    """user+system CPU seconds of a live process (0 where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _bench_backend(name: str, url: str, root: Path, anchor: dict[str, float], *, clients: int,
                   ops: Sequence[str], count: int, replicas: int, client_procs: int | None, direct: bool,
                   progress: Callable[[str], None], transport: str = "auto") -> dict[str, Any]:
    """The service figures of one backend, their ratios to the anchor, and the no-transport ceiling.

    ``transport="both"``: the clients' default path (wire), then gRPC only on a fresh KV, the
    gRPC figures under ``"grpc"`` (the comparison from the same run)."""
    runs = [("auto", "")] if transport == "both" else [(transport, "")]
    if transport == "both":
        runs.append(("grpc", "grpc"))
    res: dict[str, Any] = {}
    for mode, key in runs:
        progress(f"backend {name}: meta service, clients' transport {mode}")
        try:
            one = bench_service(url if not key else _fresh_url(url, name, key), root / (name + key), clients=clients,
                                ops=ops, count=count, replicas=replicas, client_procs=client_procs, transport=mode)
        except Exception as e:  # a backend failing is a result, not a crash of the whole run
            one = {"error": str(e)[:2000]}
        if key:
            res[key] = one
        else:
            res = one
        if "error" in res:
            return res
    res["ratio_to_local_fs"] = {op: round(v / anchor[op], 4) for op, v in res["ops_per_s"].items() if anchor.get(op)}
    if direct:
        progress(f"backend {name}: MetaStore in-process (no transport)")
        direct_url = url.replace("meta.db", "direct.db") if name == "sqlite" else url
        try:
            res["store_direct"] = bench_store_direct(direct_url, clients=clients, ops=ops, count=count)
        except Exception as e:  # noqa: BLE001 - reported next to the service figures
            res["store_direct"] = {"error": str(e)[:500]}
    return res


def _fresh_url(url: str, name: str, key: str) -> str:
    """A second, empty KV for a second service run of the same backend."""
    if name == "sqlite":
        return url.replace("meta.db", f"meta-{key}.db")
    return url.replace("schema=", f"schema={key}_")


def run_bench(*, clients: int = 8, ops: Sequence[str] = ("create", "stat", "rename", "readdir"), count: int = 500,
              pg_dsn: str | None = None, replicas: int = DEFAULT_REPLICAS, client_procs: int | None = None,
              direct: bool = True, transport: str = "auto",
              progress: Callable[[str], None] = lambda s: None
              ) -> dict[str, Any]:
    """Run every backend and the anchor; one dict (see the module doc)."""
    backends: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ff-bench-meta-") as tmp:
        root = Path(tmp)
        progress("anchor: local file system")
        anchor = bench_local_fs(root / "localfs", clients=clients, ops=ops, count=count)
        targets = [("sqlite", f"sqlite:///{root / 'sqlite' / 'meta.db'}")]
        schema = f"ffbench_{uuid.uuid4().hex[:10]}"
        if pg_dsn:
            sep = "&" if "?" in pg_dsn else "?"
            targets.append(("postgres", f"{pg_dsn}{sep}schema={schema}"))
        for name, url in targets:
            try:
                backends[name] = _bench_backend(name, url, root, anchor["ops_per_s"], clients=clients, ops=ops,
                                                count=count, replicas=replicas, client_procs=client_procs,
                                                direct=direct, progress=progress, transport=transport)
            finally:
                if name == "postgres" and pg_dsn:
                    try:
                        _drop_schema(pg_dsn, schema)
                        if transport == "both":
                            _drop_schema(pg_dsn, f"grpc_{schema}")
                    except Exception as e:  # noqa: BLE001 - reported, the figures stand
                        progress(f"could not drop schema {schema}: {e}")
    sqlite_cs = backends.get("sqlite", {}).get("creates_stats_per_s")
    return {
        "bench": "meta",
        "clients": clients,
        "count_per_client": count,
        "ops": list(ops),
        "path": "MetaClient (wire, or gRPC) -> services.meta (processes) -> MetaStore -> KV",
        "transport": transport,
        "replicas": replicas,
        "client_processes": min(client_procs or default_client_procs(clients), clients),
        "backends": backends,
        "anchor": {"name": "local_fs", **anchor},
        "goal": {"what": "creates+stats per second, SQLite, 8 clients", "target": GOAL_CREATES_STATS_PER_S,
                 "measured": sqlite_cs, "met": bool(sqlite_cs and sqlite_cs >= GOAL_CREATES_STATS_PER_S)},
        "git_sha": _git_sha(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="ff bench meta", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--ops", default="create,stat,rename,readdir", help=f"comma list of {','.join(ALL_OPS)}")
    p.add_argument("--count", type=int, default=500, help="ops per client per op (default 500)")
    p.add_argument("--replicas", type=int, default=DEFAULT_REPLICAS,
                   help=f"meta processes sharing the KV (default {DEFAULT_REPLICAS}, as deploy/local.toml)")
    p.add_argument("--client-procs", type=int, default=None,
                   help=f"processes the clients are spread over (default: one per {CLIENTS_PER_PROC} clients)")
    p.add_argument("--pg-dsn", default=None, help="also run on PostgreSQL (default $FF_TEST_PG_DSN if set)")
    p.add_argument("--no-direct", dest="direct", action="store_false",
                   help="skip the in-process MetaStore run (the ceiling without any transport)")
    p.add_argument("--transport", choices=("auto", "grpc", "both"), default="auto",
                   help="how the clients call meta: auto (its wire endpoint, as MetaClient does by default), "
                        "grpc, or both (auto, then gRPC in the same run for comparison)")
    add_json_option(p)
    ns = p.parse_args(argv)
    ops = [o.strip() for o in ns.ops.split(",") if o.strip()]
    unknown = set(ops) - set(ALL_OPS)
    if unknown or not ops:
        p.error(f"unknown ops {sorted(unknown)}; known: {', '.join(ALL_OPS)}")
    if ns.clients < 1 or ns.count < 1 or ns.replicas < 1 or (ns.client_procs is not None and ns.client_procs < 1):
        p.error("--clients, --count, --replicas and --client-procs must be >= 1")
    dsn = ns.pg_dsn or os.environ.get("FF_TEST_PG_DSN") or None
    result = run_bench(clients=ns.clients, ops=ops, count=ns.count, pg_dsn=dsn, replicas=ns.replicas,
                       client_procs=ns.client_procs, direct=ns.direct, transport=ns.transport,
                       progress=lambda s: print(f"# {s}", file=sys.stderr))
    return emit(ns.json, msgspec.to_builtins(result), lambda: _print_meta(ns, ops, result))


def _print_meta(ns: argparse.Namespace, ops: list[str], result: dict[str, Any]) -> None:
    anchor = result["anchor"]["ops_per_s"]
    print(f"meta bench: {ns.clients} clients x {ns.count} ops, cpu {result['cpu_count']}, git {str(result['git_sha'])[:10]}")
    print(f"{'op':<10}{'local fs':>12}" + "".join(f"{b:>14}{'ratio':>8}" for b in result["backends"]))
    for op in ops:
        row = f"{op:<10}{anchor.get(op, 0):>12.0f}"
        for b in result["backends"].values():
            if "error" in b:
                row += f"{'error':>14}{'':>8}"
            else:
                row += f"{b['ops_per_s'][op]:>14.0f}{b['ratio_to_local_fs'].get(op, 0):>8.3f}"
        print(row)
    goal = result["goal"]
    print(f"creates+stats/s (sqlite): {goal['measured']} vs goal {goal['target']:.0f}: {'met' if goal['met'] else 'MISSED'}"
          f" (transport {result['backends'].get('sqlite', {}).get('transport', '?')})")
    for name, b in result["backends"].items():
        if "grpc" in b and "creates_stats_per_s" in b["grpc"]:
            print(f"{name} over gRPC in the same run: {b['grpc']['creates_stats_per_s']} creates+stats/s")
    for name, b in result["backends"].items():
        if "error" in b:
            print(f"{name}: {b['error']}")
