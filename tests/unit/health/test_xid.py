"""The Xid parser on real kernel-log shapes, the Xid table, and the paper's Table VI mix."""

from __future__ import annotations

import json

import pytest

from fireflyer.cli.main import main as ff_main
from fireflyer.health.xid import ACTIONS, XID_TABLE, count_by, parse_lines, parse_text, summarize, xid_info

# (line, xid, pci, gpu_instance, pid, process, message start): real shapes (see the research notes)
SHAPES = [
    ("[12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
     79, "0000:3b:00", None, 1234, "python3", "GPU has fallen off the bus."),
    ("[  171.620236] NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     79, "0000:05:00", None, None, "", "GPU has fallen off the bus."),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "0000:03:00", None, None, "", "Channel 00000001"),
    ("[Tue Mar  5 10:11:12 2024] NVRM: Xid (PCI:0000:3b:00): 48, pid=99, name=train, DBE (double bit error) ECC",
     48, "0000:3b:00", None, 99, "train", "DBE (double bit error)"),
    ("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:4c:00): 94, Contained: SM (0x1). RST: No, D-RST: No",
     94, "0000:4c:00", None, None, "", "Contained: SM (0x1). RST: No, D-RST: No"),
    ("Mar 05 10:11:12 gpu-node-07 kernel: NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, "
     "Graphics SM Warp Exception on (GPC 7, TPC 1, SM 0): Out Of Range Address",
     13, "0000:cb:00", None, None, "", "Graphics SM Warp Exception"),
    ("Oct  1 13:00:00 host kernel: [171167.620236] NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: "
     "New row marked for remapping, reset gpu to activate.", 63, "0000:10:1c", None, 1896, "", "Row Remapper"),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
     94, "0000:01:00", 5, 7194, "", "Contained: CE User Channel"),
    ("[ 8821.11] NVRM: Xid (PCI:0000:3b:00, GPU-I:05): 31, pid=4242, name=python, Ch 00000008, intr 00000000. "
     "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f5c_0e000000. Fault is of type FAULT_PDE",
     31, "0000:3b:00", 5, 4242, "python", "Ch 00000008"),
    ("2024-03-05T10:11:12.123456+00:00 node3 kernel: NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, "
     "name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 "
     "(GSP_RM_ALLOC) (0x2081 0x4).", 119, "0000:9b:00", None, 2024380, "nvidia-smi", "Timeout after 6s"),
    ("kern  :warn  : [Tue Mar  5 10:11:12 2024] NVRM: Xid (PCI:0000:b3:00): 74, pid=3113, name=pt_main_thread, "
     "NVLink: fatal error detected on link 5(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
     74, "0000:b3:00", None, 3113, "pt_main_thread", "NVLink: fatal error"),
    ("kern  :err   : [ 5521.000001] NVRM: Xid (PCI:0000:b3:00): 74, NVLink: Link 3 (0x0, 0x0, 0x0, 0x200, 0x0, 0x0, 0x0)",
     74, "0000:b3:00", None, None, "", "NVLink: Link 3"),
    ("[  999.5] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
     154, "0009:01:00", None, None, "", "GPU recovery action changed"),
    ("Feb  3 01:02:03 n12 kernel: [ 12.0] NVRM: Xid (PCI:0000:4C:00): 43, pid=538574, name=python, Ch 00000010",
     43, "0000:4c:00", None, 538574, "python", "Ch 00000010"),
    ("[ 77.0] NVRM: Xid (PCI:0000:4c:00): 45, pid=538574, name=python, Ch 00000010",
     45, "0000:4c:00", None, 538574, "python", "Ch 00000010"),
    ("2025-01-02T03:04:05Z n1 kernel: NVRM: Xid (PCI:0000:18:00): 62, pid='<unknown>', name=<unknown>, 0000a0b2 "
     "00000000 00000000", 62, "0000:18:00", None, None, "", "0000a0b2"),
    ("[ 4.2] NVRM: Xid (PCI:0000:18:00): 61, pid=0, 0cec(3094) 00000000 00000000", 61, "0000:18:00", None, 0, "",
     "0cec(3094)"),
    ("[ 6.1] NVRM: Xid (PCI:0000:18:00): 95, pid=1766, name=python, Uncontained: FBHUB. RST: Yes, D-RST: No",
     95, "0000:18:00", None, 1766, "python", "Uncontained: FBHUB"),
    ("[ 6.2] NVRM: Xid (PCI:0000:18:00): 64", 64, "0000:18:00", None, None, "", ""),
    ("Mar 05 10:11:12.345678 gpu3 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
     "GPU has fallen off the bus.", 79, "0000:3b:00", None, None, "", "GPU has fallen off the bus."),
    # journalctl -k -o short-iso (systemd < 255 prints +0800, newer +08:00)
    ("2024-03-05T10:11:12+0800 gpu-node-07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, "
     "GPU has fallen off the bus.", 79, "0000:3b:00", None, 1, "python", "GPU has fallen off the bus."),
    # journalctl -k -o short-monotonic
    ("[  171.620236] gpu-node-07 kernel: NVRM: Xid (PCI:0000:05:00): 48, pid=7, name=train, DBE (double bit error) "
     "ECC error", 48, "0000:05:00", None, 7, "train", "DBE (double bit error)"),
    # dmesg -T on a MIG GPU
    ("[Tue Mar  5 10:11:12 2024] NVRM: Xid (PCI:0000:01:00 GPU-I:02): 31, pid=55, name=python, Ch 00000008, intr 0. "
     "MMU Fault", 31, "0000:01:00", 2, 55, "python", "Ch 00000008"),
    # an old driver's journal line without PCI:
    ("Mar 05 10:11:12 host kernel: NVRM: Xid (0000:3b:00): 13, Graphics Exception: ESR 0x405840=0x0",
     13, "0000:3b:00", None, None, "", "Graphics Exception"),
    # rsyslog RFC 3339 with the kernel's stamp inside; an upper-case bus id with its function
    ("2024-03-05T10:11:12.123456+08:00 host kernel: [   55.100000] NVRM: Xid (PCI:0000:3B:00.0): 74, pid=9, "
     "name=python, NVLink: fatal error detected on link 2", 74, "0000:3b:00", None, 9, "python", "NVLink: fatal"),
    # dmesg -x without stamps (dmesg -t -x)
    ("kern  :warn  : NVRM: Xid (PCI:0000:3b:00): 45, pid=538574, name=python, Ch 00000010",
     45, "0000:3b:00", None, 538574, "python", "Ch 00000010"),
    # dmesg -r: the raw priority before the stamp
    ("<4>[   12.000000] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
     79, "0000:3b:00", None, None, "", "GPU has fallen off the bus."),
    # a /dev/kmsg record
    ("4,1234,171620236,-;NVRM: Xid (PCI:0000:4c:00): 94, pid=7194, Contained: SM (0x1). RST: No, D-RST: No",
     94, "0000:4c:00", None, 7194, "", "Contained: SM (0x1)"),
    # an Xid the table does not know (92: high single-bit ECC rate)
    ("[    5.000000] NVRM: Xid (PCI:0000:3b:00): 92, pid=1, name=python, High single-bit ECC error rate",
     92, "0000:3b:00", None, 1, "python", "High single-bit ECC"),
]


@pytest.mark.parametrize("line,xid,pci,gi,pid,name,msg", SHAPES, ids=[str(i) for i in range(len(SHAPES))])
def test_parser_reads_each_real_shape(line: str, xid: int, pci: str, gi: int | None, pid: int | None, name: str,
                                      msg: str) -> None:
    r = parse_text(line)
    assert len(r.events) == 1, r.stats
    e = r.events[0]
    assert (e.xid, e.pci, e.gpu_instance, e.pid, e.process) == (xid, pci, gi, pid, name)
    assert e.message.startswith(msg)
    assert e.line == 1


def test_shapes_cover_at_least_fifteen() -> None:
    assert len(SHAPES) >= 15


def test_timestamps_and_hosts_of_each_prefix() -> None:
    r = parse_text("\n".join([
        "[12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "[Tue Mar  5 10:11:12 2024] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "Mar 05 10:11:12 host7 kernel: [ 55.5] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "[  171.620236] gpu-node-07 kernel: NVRM: Xid (PCI:0000:05:00): 48, DBE",
        "4,1234,171620236,-;NVRM: Xid (PCI:0000:4c:00): 94, Contained",
        "<4>[   12.000000] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
    ]))
    assert [(e.timestamp, e.uptime_s, e.host) for e in r.events] == [
        ("12345.678901", 12345.678901, ""), ("Tue Mar  5 10:11:12 2024", None, ""),
        ("Mar 05 10:11:12", 55.5, "host7"), ("171.620236", 171.620236, "gpu-node-07"),
        ("171.620236", 171.620236, ""), ("12.000000", 12.0, "")]
    assert r.events[0].raw == "[12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."


def test_stream_holds_an_xid_until_its_dump_ends_and_counts_floods() -> None:
    from fireflyer.health.xid import XidStream

    s = XidStream()
    lines = GSP_DUMP.splitlines()
    out = []
    for i, line in enumerate(lines):
        got = s.feed(line)
        if i < 17:
            assert got == [], (i, line)  # the context, the Xid, then its dump: nothing complete yet
        out += got
    assert [e.xid for e in out] == [119] and len(out[0].detail) == 14  # the eth0 line closed the first
    assert out[0].uuid.startswith("GPU-45eab12c")
    (last,) = s.flush()
    assert last.xid == 119 and last.detail == () and s.flush() == []
    assert s.feed("[ 2000.0] nvidia: 12 callbacks suppressed") == [] and s.take_suppressed() == 12
    assert s.take_suppressed() == 0 and s.stats.suppressed == 12


GSP_DUMP = """\
[ 1000.000001] NVRM: GPU at PCI:0000:9b:00: GPU-45eab12c-1111-2222-3333-444455556666
[ 1000.000002] NVRM: GPU Board Serial Number: 1650123456789
[ 1000.100000] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC \
response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).
[ 1000.100001] NVRM: GPU4 GSP RPC buffer contains function 103 (GSP_RM_ALLOC) and data 0x0000000000002081 0x4.
[ 1000.100002] NVRM: GPU4 RPC history (CPU -> GSP):
[ 1000.100003] NVRM:     entry function                   data0              data1              ts_start
[ 1000.100004] NVRM:      0    103   GSP_RM_ALLOC          0x0000000000002081 0x0000000000000004 0x0005f5b9e8b3e3ad
[ 1000.100005] NVRM:     -1    10    FREE                  0x00000000c1d00105 0x0000000000000000 0x0005f5b9e8b3e39e
[ 1000.100006] NVRM: GPU4 RPC event history (CPU <- GSP):
[ 1000.100007] CPU: 12 PID: 2024380 Comm: nvidia-smi Tainted: P           OE     5.15.0-91-generic #101-Ubuntu
[ 1000.100008] Hardware name: Supermicro SYS-421GE-TNRT/X13DEG-OAD, BIOS 1.4 02/23/2023
[ 1000.100009] Call Trace:
[ 1000.100010]  <TASK>
[ 1000.100011]  dump_stack_lvl+0x4a/0x63
[ 1000.100012]  _nv011486rm+0x3ff/0x480 [nvidia]
[ 1000.100013]  </TASK>
[ 1000.100014] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of every 30).  \
The GPU likely needs to be reset.
[ 1000.200000] eth0: Link is Up - 100Gbps/Full - flow control off
[ 1000.300000] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC \
response from GPU4 GSP! Expected function 10 (FREE) (0xc1d00105 0x0).
"""


def test_gsp_dump_lines_are_continuations_not_events() -> None:
    r = parse_text(GSP_DUMP)
    assert [e.xid for e in r.events] == [119, 119]
    first, second = r.events
    assert len(first.detail) == 14 and first.detail[-1].startswith("NVRM: Rate limiting GSP RPC")
    assert any("GSP_RM_ALLOC" in d for d in first.detail) and "Call Trace:" in first.detail
    assert second.detail == ()  # the eth0 line ended the dump
    assert first.uuid == second.uuid == "GPU-45eab12c-1111-2222-3333-444455556666"
    assert r.stats.continuation == 14


def test_floods_sxid_duplicates_and_foreign_lines() -> None:
    text = "\n".join([
        "[ 10.000001] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, Ch 00000008, intr 10000000. MMU Fault",
        "[ 10.000001] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, Ch 00000008, intr 10000000. MMU Fault",
        "[ 10.000002] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, Ch 00000008, intr 10000000. MMU Fault",
        "[ 10.500000] nvidia_uvm: 412 callbacks suppressed",
        "[ 10.500001] printk: 17 messages suppressed.",
        "[ 11.0] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 12028, Non-fatal, Link 62 egress non-posted PRIV error",
        "[ 11.1] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 12028, Severity 0 Engine instance 62 Sub-engine instance 00",
        "Mar 05 10:11:12 host systemd[1]: NVRM: Xid (PCI:0000:3b:00): 79, not the kernel's line",
        "Mar 05 10:11:13 host kernel: NVRM: Xid (PCI:zzzz): 79, bad device",
    ])
    r = parse_text(text)
    assert [e.xid for e in r.events] == [31, 31]
    s = r.stats
    assert (s.duplicates, s.suppressed, s.rate_limit_lines, s.sxid, s.malformed) == (1, 429, 2, 2, 1)


def test_table_rows_are_complete_and_application_xids_blame_the_job() -> None:
    for info in XID_TABLE.values():
        assert set(info.actions) <= set(ACTIONS) and info.on_repeat in ACTIONS
        assert info.blame in ("job", "node")
    assert {x for x, i in XID_TABLE.items() if i.blame == "job"} == {13, 31, 43, 45, 69}
    assert XID_TABLE[79].actions == ("drain", "reboot_node") and XID_TABLE[74].category == "nvlink"
    assert "drain" in xid_info(999).actions  # an unknown Xid is taken seriously


# --- the paper's Table VI: one year of Fire-Flyer 2 Xids ------------------------------------------------------------

TABLE_VI = {74: 5521, 43: 4342, 31: 2487, 45: 240, 63: 245, 13: 45, 79: 37, 95: 17, 94: 13, 61: 13, 62: 3, 64: 2,
            48: 2, 44: 1, 69: 1, 119: 1}
#: shares the paper prints (percent)
PAPER_SHARES = {74: 42.57, 43: 33.48, 31: 19.18, 63: 1.89, 45: 1.85}
#: Table V's groups, from the same counts
GROUP_SHARES = {"nvlink": 42.57, "software": 54.85, "ecc": 2.14, "uncorrectable": 0.44, "gsp": 0.01}

_PREFIXES = [
    lambda i: f"[{1000 + i * 0.001:.6f}] ",
    lambda i: f"[Tue Mar  5 10:{i // 60 % 60:02d}:{i % 60:02d} 2024] ",
    lambda i: f"Mar 05 10:{i // 60 % 60:02d}:{i % 60:02d} gpu-node-{i % 7:02d} kernel: ",
    lambda i: f"Oct  1 13:00:00 host kernel: [{50000 + i * 0.001:.6f}] ",
    lambda i: f"2024-03-05T10:11:12.{i:06d}+00:00 node3 kernel: ",
    lambda i: f"kern  :warn  : [{7 + i * 0.001:.6f}] ",
]
_DEVICES = ["PCI:0000:3b:00", "0000:5e:00", "PCI:0000:01:00 GPU-I:05", "PCI:0000:b1:00, GPU-I:13", "PCI:0000:cb:00"]
_TAILS = ["pid=538574, name=python, Ch 00000010", "pid='<unknown>', name=<unknown>, Ch 00000002",
          "NVLink: fatal error detected on link 5(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)", "pid=7194, Contained: SM (0x1)."]


def table_vi_log() -> str:
    lines: list[str] = []
    n = 0
    for xid, count in TABLE_VI.items():
        for _ in range(count):
            pre = _PREFIXES[n % len(_PREFIXES)](n)
            lines.append(f"{pre}NVRM: Xid ({_DEVICES[n % len(_DEVICES)]}): {xid}, {_TAILS[n % len(_TAILS)]}")
            if xid == 119 or n % 997 == 0:  # a GSP RPC dump and stack trace after some events
                lines += [f"{pre}NVRM: GPU4 RPC history (CPU -> GSP):",
                          f"{pre}NVRM:     entry function  data0  data1",
                          f"{pre}NVRM:      0    103   GSP_RM_ALLOC  0x2081 0x4", f"{pre}Call Trace:",
                          f"{pre} <TASK>", f"{pre} dump_stack_lvl+0x4a/0x63", f"{pre} </TASK>"]
            if n % 500 == 0:  # floods and NVSwitch noise
                lines += [f"{pre}nvidia: 23 callbacks suppressed", f"{pre}printk: 5 messages suppressed.",
                          f"{pre}nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 12028, Non-fatal, Link 62"]
            n += 1
    return "\n".join(lines) + "\n"


def test_table_vi_mix_reproduces_every_share() -> None:
    r = parse_text(table_vi_log())
    assert r.stats.malformed == 0 and r.stats.duplicates == 0 and r.stats.sxid > 0 and r.stats.continuation > 0
    summary = summarize(r.events, r.stats)
    assert summary.total == 12970
    by_xid = {int(row.key): row for row in summary.by_xid}
    assert {x: row.count for x, row in by_xid.items()} == TABLE_VI
    for xid, count in TABLE_VI.items():
        assert round(by_xid[xid].share_pct, 2) == round(100 * count / 12970, 2)
    for xid, pct in PAPER_SHARES.items():
        assert round(by_xid[xid].share_pct, 2) == pct
    assert {row.key: round(row.share_pct, 2) for row in summary.by_group} == GROUP_SHARES
    assert summary.blame_job == 45 + 4342 + 2487 + 240 + 1


def test_count_by_rejects_unknown_key() -> None:
    with pytest.raises(ValueError):
        count_by([], "colour")


def test_cli_prints_counts_and_shares(tmp_path, capsys) -> None:
    log = tmp_path / "kern.log"
    log.write_text(table_vi_log())
    assert ff_main(["health", "xid", str(log), "--by", "group"]) == 0
    out = capsys.readouterr().out
    assert "12970 Xid events" in out and "nvlink" in out and "42.57%" in out and "NVSwitch SXid" in out
    assert ff_main(["health", "xid", str(log), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["total"] == 12970 and doc["by_group"][0]["key"] == "software"
    assert ff_main(["health", "xid", str(tmp_path / "nope.log")]) == 1


def test_parse_lines_reads_a_file_object(tmp_path) -> None:
    p = tmp_path / "dmesg.txt"
    p.write_text("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\r\n\n")
    with open(p) as f:
        assert [e.xid for e in parse_lines(f).events] == [79]
