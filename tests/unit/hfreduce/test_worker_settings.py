"""Worker settings: FF_HFREDUCE_* environment, job-wide fallbacks, flags win, bad values named."""

from __future__ import annotations

import pytest

from fireflyer.core.errors import SettingsError
from fireflyer.hfreduce._blocks import BLOCK_BYTES
from fireflyer.hfreduce.settings import load_worker_settings, parse_size


def test_worker_parse_size() -> None:
    assert parse_size("4M") == 4 << 20
    assert parse_size("512k") == 512 << 10
    assert parse_size("1MiB") == 1 << 20
    assert parse_size("4096") == 4096
    with pytest.raises(SettingsError):
        parse_size("four")


def test_worker_settings_precedence() -> None:
    s = load_worker_settings(env={})
    assert s.chunk_bytes == 4 << 20 and s.timeout_s == 60.0 and s.nats_url == ""
    env = {"FF_HFREDUCE_CHUNK_SIZE": "1M", "FF_HFREDUCE_TIMEOUT_S": "5", "FF_NATS_URL": "nats://x:1",
           "FF_JOB_ID": "j7"}
    s = load_worker_settings(env=env)
    assert (s.chunk_bytes, s.timeout_s, s.nats_url, s.job_id) == (1 << 20, 5.0, "nats://x:1", "j7")
    s = load_worker_settings(env=env, overrides={"chunk_size": "64k", "timeout_s": None})
    assert s.chunk_bytes == 64 << 10 and s.timeout_s == 5.0


def test_worker_settings_bad_values_name_the_key() -> None:
    with pytest.raises(SettingsError, match="timeout_s"):
        load_worker_settings(env={"FF_HFREDUCE_TIMEOUT_S": "soon"})
    with pytest.raises(SettingsError, match="chunk_size"):
        load_worker_settings(env={"FF_HFREDUCE_CHUNK_SIZE": "8"})


def test_worker_block_size_and_stream_switch() -> None:
    s = load_worker_settings(env={})
    # the worker's default is the engine's (a node started either way frames blocks alike)
    assert s.block_bytes == BLOCK_BYTES == 512 << 10 and s.stream is True
    s = load_worker_settings(env={"FF_HFREDUCE_BLOCK_SIZE": "128K", "FF_HFREDUCE_STREAM": "false"})
    assert s.block_bytes == 128 << 10 and s.stream is False
    with pytest.raises(SettingsError, match="block_size"):
        load_worker_settings(env={"FF_HFREDUCE_BLOCK_SIZE": "1K"})
    with pytest.raises(SettingsError, match="block_size"):
        load_worker_settings(env={"FF_HFREDUCE_BLOCK_SIZE": "lots"})


def test_worker_socket_buffer_size_is_auto_tuned_unless_set() -> None:
    assert load_worker_settings(env={}).sock_buf_bytes is None
    assert load_worker_settings(env={"FF_HFREDUCE_SOCK_BUF_SIZE": "1M"}).sock_buf_bytes == 1 << 20
    with pytest.raises(SettingsError, match="sock_buf_size"):
        load_worker_settings(env={"FF_HFREDUCE_SOCK_BUF_SIZE": "100"})


@pytest.mark.parametrize("key", ["SOCK_BUF_SIZE", "SEND_BUF_SIZE"])
def test_a_fixed_link_buffer_below_64k_is_refused_with_the_reason(key: str) -> None:
    # below 64K (doubled by the kernel: under two ~64 KiB loopback segments) a link stalls between
    # segments: a 4 x 1 64 MiB op took 70x as long with 32K
    from fireflyer.hfreduce.settings import MIN_SOCK_BUF

    assert MIN_SOCK_BUF == 64 << 10
    for small in ("32K", "65535"):
        with pytest.raises(SettingsError, match=f"{key.lower()} must be empty .auto-tuning. or at least 64K.*stalls"):
            load_worker_settings(env={f"FF_HFREDUCE_{key}": small})
    assert getattr(load_worker_settings(env={f"FF_HFREDUCE_{key}": "64K"}), key.lower().replace("size", "bytes")) \
        == 64 << 10


def test_worker_send_buffer_auto_tunes_unless_told_and_the_launcher_tells_it_256k() -> None:
    from fireflyer.hfreduce.launch_plan import LOOPBACK_SEND_BUF, worker_env

    assert load_worker_settings(env={}).send_buf_bytes is None  # between hosts: the kernel's auto-tuning
    assert load_worker_settings(env={"FF_HFREDUCE_SEND_BUF_SIZE": "1M"}).send_buf_bytes == 1 << 20
    with pytest.raises(SettingsError, match="send_buf_size"):
        load_worker_settings(env={"FF_HFREDUCE_SEND_BUF_SIZE": "2k"})
    # ff launch's nodes share loopback: 256K unless the environment says otherwise (empty: auto-tuning)
    assert LOOPBACK_SEND_BUF == "256K"
    assert load_worker_settings(env=worker_env({"A": "1"})).send_buf_bytes == 256 << 10
    assert worker_env({"A": "1"}) == {"A": "1", "FF_HFREDUCE_SEND_BUF_SIZE": "256K"}
    assert load_worker_settings(env=worker_env({"FF_HFREDUCE_SEND_BUF_SIZE": ""})).send_buf_bytes is None
    assert load_worker_settings(env=worker_env({"FF_HFREDUCE_SEND_BUF_SIZE": "1M"})).send_buf_bytes == 1 << 20


def test_worker_links_avoid_the_system_congestion_control_unless_told() -> None:
    assert load_worker_settings(env={}).congestion_prefs == ("cubic", "reno")
    assert load_worker_settings(env={"FF_HFREDUCE_TCP_CONGESTION": " reno "}).congestion_prefs == ("reno",)
    assert load_worker_settings(env={"FF_HFREDUCE_TCP_CONGESTION": ""}).congestion_prefs == ()  # system default
    with pytest.raises(SettingsError, match="tcp_congestion"):
        load_worker_settings(env={"FF_HFREDUCE_TCP_CONGESTION": "cubic,BBR!"})


def test_the_launcher_gives_nodes_with_several_ranks_a_256k_block_where_l2_is_512k_or_less() -> None:
    from fireflyer.hfreduce.launch_plan import loopback_block, worker_env

    assert load_worker_settings(env={}).block_bytes == 512 << 10  # the worker's own default
    for ranks, l2, block in ((4, 512 << 10, "256K"), (2, 256 << 10, "256K"), (1, 512 << 10, None),
                             (4, 1 << 20, None), (4, 2 << 20, None), (4, None, None), (4, 0, None)):
        assert loopback_block(ranks, l2) == block, (ranks, l2)
    env = worker_env({"A": "1"}, local_ranks=4, l2_bytes=512 << 10)
    assert env["FF_HFREDUCE_BLOCK_SIZE"] == "256K" and load_worker_settings(env=env).block_bytes == 256 << 10
    assert "FF_HFREDUCE_BLOCK_SIZE" not in worker_env({}, local_ranks=4, l2_bytes=1 << 20)
    assert "FF_HFREDUCE_BLOCK_SIZE" not in worker_env({}, local_ranks=1, l2_bytes=512 << 10)
    # an explicit setting wins (every worker of the job must have the same block either way)
    told = worker_env({"FF_HFREDUCE_BLOCK_SIZE": "512K"}, local_ranks=4, l2_bytes=512 << 10)
    assert told["FF_HFREDUCE_BLOCK_SIZE"] == "512K"


def test_ff_launch_hands_its_workers_the_block_for_its_local_ranks(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fireflyer.hfreduce import launch, launch_plan
    from fireflyer.hfreduce.launch_plan import LaunchOptions

    monkeypatch.setattr(launch_plan, "cache_bytes", lambda level, base="": 512 << 10 if level == 2 else None)
    seen: list[dict[str, str]] = []

    class Started(Exception):
        pass

    def popen(argv, env, **kw):  # type: ignore[no-untyped-def]
        seen.append(dict(env))
        raise Started

    monkeypatch.setattr(launch.Launcher, "_popen", staticmethod(popen))
    for ranks, block in ((4, "256K"), (1, None)):
        launcher = launch.Launcher(LaunchOptions(nodes=2, local_ranks=ranks), ["true"], env={"PATH": "/usr/bin"})
        with pytest.raises(Started):
            launcher._start_workers(launcher._plan(tmp_path))
        assert seen[-1].get("FF_HFREDUCE_BLOCK_SIZE") == block


def test_the_express_poll_defaults_to_the_engine_s_and_is_bounded() -> None:
    from fireflyer.hfreduce.express import EXPRESS_POLL_S

    assert load_worker_settings(env={}).express_poll_s == pytest.approx(EXPRESS_POLL_S)
    assert load_worker_settings(env={"FF_HFREDUCE_EXPRESS_POLL_US": "0"}).express_poll_s == 0.0  # off
    assert load_worker_settings(env={"FF_HFREDUCE_EXPRESS_POLL_US": "50"}).express_poll_s == pytest.approx(50e-6)
    for bad in ("-1", "20000", "soon"):
        with pytest.raises(SettingsError, match="express_poll_us"):
            load_worker_settings(env={"FF_HFREDUCE_EXPRESS_POLL_US": bad})


def test_the_launcher_runs_three_or_more_nodes_around_a_ring() -> None:
    from fireflyer.hfreduce.launch_plan import loopback_algorithm, worker_env

    assert loopback_algorithm(4) == "ring" and loopback_algorithm(3) == "ring" and loopback_algorithm(64) == "ring"
    assert loopback_algorithm(2) is None and loopback_algorithm(1) is None
    assert worker_env({}, nodes=4)["FF_HFREDUCE_ALGORITHM"] == "ring"
    assert worker_env({}, nodes=4, local_ranks=2)["FF_HFREDUCE_ALGORITHM"] == "ring"
    assert "FF_HFREDUCE_ALGORITHM" not in worker_env({}, nodes=2, local_ranks=4)
    assert worker_env({"FF_HFREDUCE_ALGORITHM": "tree"}, nodes=4)["FF_HFREDUCE_ALGORITHM"] == "tree"  # asked for
    assert load_worker_settings(env=worker_env({}, nodes=5)).algorithm == "ring"
