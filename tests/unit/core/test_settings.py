import argparse

import msgspec
import pytest

from fireflyer.core import SettingsError, load_settings
from fireflyer.core.config import ServiceSettings
from fireflyer.core.settings import add_settings_args, overrides_from_args, settings_keys


class Inner(msgspec.Struct, frozen=True, kw_only=True):
    port: int = 1
    ratio: float = 0.5
    hosts: list[str] = []
    name: str | None = None


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    debug: bool = False
    timeout_s: float = 3.0
    inner: Inner = msgspec.field(default_factory=Inner)


def test_defaults_file_env_cli_precedence(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text("timeout_s = 5.0\n[inner]\nport = 10\nratio = 0.1\n")
    s = load_settings(Sample, file=f, env={"FF_INNER_PORT": "20", "FF_DEBUG": "true"},
                      overrides={"inner.port": "30"})
    assert s == Sample(debug=True, timeout_s=5.0, inner=Inner(port=30, ratio=0.1))


def test_env_lists_and_optionals():
    s = load_settings(Sample, env={"FF_INNER_HOSTS": "a, b,c", "FF_INNER_NAME": "none"})
    assert s.inner.hosts == ["a", "b", "c"] and s.inner.name is None
    s = load_settings(Sample, env={"FF_INNER_HOSTS": '["x"]', "FF_INNER_NAME": "n1"})
    assert s.inner.hosts == ["x"] and s.inner.name == "n1"


def test_bad_env_value_names_key_type_and_source():
    with pytest.raises(SettingsError) as e:
        load_settings(Sample, env={"FF_INNER_PORT": "eighty"})
    assert e.value.key == "inner.port" and e.value.expected == "int"
    assert "FF_INNER_PORT" in str(e.value) and "'inner.port'" in str(e.value)


def test_bad_file_value_and_unknown_key(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[inner]\nport = "x"\n')
    with pytest.raises(SettingsError, match="inner.port.*expected int") as e:
        load_settings(Sample, file=f)
    assert str(f) in str(e.value)
    f.write_text("[inner]\nprot = 3\n")
    with pytest.raises(SettingsError, match="unknown setting 'inner.prot'"):
        load_settings(Sample, file=f)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(Sample, file=tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("a = [")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings(Sample, file=bad)


def test_cli_overrides_parse_and_reject_unknown():
    p = argparse.ArgumentParser()
    add_settings_args(p)
    ns = p.parse_args(["--set", "inner.ratio=0.25", "--set", "debug=1"])
    assert load_settings(Sample, overrides=overrides_from_args(ns)).inner.ratio == 0.25
    with pytest.raises(SettingsError, match="unknown setting 'inner.nope'"):
        load_settings(Sample, overrides={"inner.nope": "1"})
    ns = p.parse_args(["--set", "novalue"])
    with pytest.raises(SettingsError, match="KEY=VALUE"):
        overrides_from_args(ns)


def test_settings_are_frozen_and_keys_listed():
    s = load_settings(ServiceSettings, env={})
    with pytest.raises(AttributeError):
        s.grace_s = 1.0  # type: ignore[misc]
    keys = settings_keys(ServiceSettings)
    assert "nats.url" in keys and "rpc.port" in keys and "grace_s" in keys


def test_service_settings_env_names_match_design():
    s = load_settings(ServiceSettings, env={"FF_NATS_URL": "nats://h:1", "FF_STATE_DIR": "/tmp/x",
                                            "FF_TOKEN": "t", "FF_RPC_PORT": "7001", "FF_LOG_FORMAT": "text"})
    assert (s.nats.url, s.state_dir, s.token, s.rpc.port, s.log_format) == ("nats://h:1", "/tmp/x", "t", 7001, "text")
    with pytest.raises(SettingsError, match="log_format"):
        load_settings(ServiceSettings, env={"FF_LOG_FORMAT": "xml"})
