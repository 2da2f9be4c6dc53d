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
