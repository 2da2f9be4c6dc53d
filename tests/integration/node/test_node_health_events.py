"""A node agent process follows a kernel log and a sysfs tree and publishes Xid, link and advice events on NATS."""

from __future__ import annotations

from pathlib import Path

from conftest import Tokens, astart, make_agent

from fireflyer.bus import Bus
from fireflyer.bus.server import NatsServerProcess
from fireflyer.health.events import LinkEvent, NodeAdvice, XidEvent, advice_subject, link_subject, xid_subject
from fireflyer.testing.nats import fast_nats_settings
from fireflyer.testing.poll import wait_for


def put(root: Path, iface: str, operstate: str, carrier: str, changes: int) -> None:
    d = root / "class" / "net" / iface
    d.mkdir(parents=True, exist_ok=True)
    for name, value in (("operstate", operstate), ("carrier", carrier), ("carrier_changes", str(changes)),
                        ("speed", "200000")):
        (d / name).write_text(value + "\n")


async def test_agent_publishes_xids_links_and_advice(tmp_path: Path, nats_mod: NatsServerProcess,
                                                     tokens: Tokens) -> None:
    kmsg, sysfs = tmp_path / "kern.log", tmp_path / "sys"
    kmsg.write_text("[    1.000000] NVRM: Xid (PCI:0000:3b:00): 79, before the agent: not published\n")
    put(sysfs, "ib0", "up", "1", 0)
    agent = make_agent(tmp_path / "state", nats_mod, tokens, instance="node-2",
                       FF_NODE_KMSG_FILE=str(kmsg), FF_NODE_KMSG_POLL_S="0.02", FF_NODE_XID_FLOOD_WINDOW_S="1",
                       FF_NODE_SYSFS_ROOT=str(sysfs), FF_NODE_LINK_INTERVAL_S="0.05",
                       FF_NODE_FLASHCUT_DRAIN_AFTER="2")
    got: list[object] = []

    async def on(ev: object, _msg: object) -> None:
        got.append(ev)

    async with await Bus.connect(fast_nats_settings(nats_mod.url), name="t") as bus:
        await bus.subscribe(xid_subject("node2"), on, types=XidEvent)
        await bus.subscribe(link_subject("node2"), on, types=LinkEvent)
        await bus.subscribe(advice_subject("node2"), on, types=NodeAdvice)
        await astart(agent)
        try:
            with open(kmsg, "a") as f:  # noqa: ASYNC230 -- a test's small write
                f.write("[  100.000001] NVRM: GPU at PCI:0000:9b:00: GPU-45eab12c-1111-2222-3333-444455556666\n"
                        "[  100.100000] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout "
                        "after 6s of waiting for RPC response from GPU4 GSP!\n"
                        "[  100.100001] NVRM: GPU4 RPC history (CPU -> GSP):\n"
                        "[  100.100002] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 12028, Non-fatal, Link 62\n"
                        "[  100.200000] nvidia: 7 callbacks suppressed\n"
                        + "".join(f"[  101.{i:06d}] NVRM: Xid (PCI:0000:3b:00 GPU-I:05): 31, pid=42, name=python, "
                                  f"MMU Fault\n" for i in range(50)))
            xids = lambda: [e for e in got if isinstance(e, XidEvent)]  # noqa: E731
            await wait_for(lambda: len(xids()) >= 3, timeout_s=15, what="the Xids and the flood's summary")
            gsp, first31, rest31 = xids()[:3]
            assert (gsp.node, gsp.xid, gsp.pci, gsp.uuid, gsp.category, gsp.blame, gsp.action) == (
                "node2", 119, "0000:9b:00", "GPU-45eab12c-1111-2222-3333-444455556666", "gsp", "node", "drain")
            assert gsp.detail == ("NVRM: GPU4 RPC history (CPU -> GSP):",)  # the SXid line ended the dump
            assert (first31.xid, first31.gpu_instance, first31.count, first31.summary, first31.suppressed,
                    first31.blame, first31.action) == (31, 5, 1, False, 7, "job", "restart_job")
            assert (rest31.count, rest31.summary) == (49, True)
            assert all(e.xid != 79 for e in xids())  # the log's past is not replayed
            put(sysfs, "ib0", "down", "0", 1)
            await wait_for(lambda: any(isinstance(e, LinkEvent) and e.kind == "down" for e in got), timeout_s=10,
                           what="a link down event")
            put(sysfs, "ib0", "up", "1", 4)  # up, and a flap hidden between samples: the second fault
            await wait_for(lambda: any(isinstance(e, NodeAdvice) and e.source == "flashcut" for e in got),
                           timeout_s=10, what="drain advice")
        finally:
            agent.stop()
    advice = [(e.source, e.action) for e in got if isinstance(e, NodeAdvice)]
    assert advice == [("xid", "drain"), ("xid", "restart_job"), ("flashcut", "drain")]


