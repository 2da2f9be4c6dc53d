"""The cluster file: defaults, the shipped deploy/local.toml, and errors that name the bad key."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from fireflyer.cluster.config import (
    ClusterConfig,
    default_config_path,
    load_cluster_config,
    parse_cluster_config,
)
from fireflyer.core.errors import SettingsError

REPO = Path(__file__).resolve().parents[3]


def test_defaults_and_instances() -> None:
    cfg = parse_cluster_config({"service": [{"name": "meta", "module": "services.meta", "replicas": 3}]})
    assert cfg.nats.port == 0 and cfg.nats.url is None
    (meta,) = cfg.service
    assert meta.instances() == ["meta-0", "meta-1", "meta-2"]
    assert cfg.ready_timeout_for(meta) == cfg.cluster.ready_timeout_s


def test_per_service_ready_timeout_wins() -> None:
    cfg = parse_cluster_config({"cluster": {"ready_timeout_s": 5.0},
                                "service": [{"name": "a", "module": "m", "ready_timeout_s": 60.0},
                                            {"name": "b", "module": "m"}]})
    assert [cfg.ready_timeout_for(s) for s in cfg.service] == [60.0, 5.0]


def test_shipped_local_toml_lists_echo() -> None:
    cfg = load_cluster_config(REPO / "deploy" / "local.toml")
    assert "fireflyer.testing.echo" in [s.module for s in cfg.service]
    assert cfg.nats.url is None  # a managed server by default


def test_default_config_path_falls_back_to_checkout(tmp_path: Path) -> None:
    assert default_config_path(tmp_path) == REPO / "deploy" / "local.toml"
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "local.toml").write_text("")
    assert default_config_path(tmp_path) == tmp_path / "deploy" / "local.toml"


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"service": [{"name": "echo", "modul": "x"}]}, "service[0].modul"),
        ({"service": [{"name": "echo"}]}, "service[0].module"),
        ({"service": [{"name": "echo", "module": "m", "replicas": "2"}]}, "service[0].replicas"),
        ({"service": [{"name": "echo", "module": "m", "replicas": 0}]}, "service[0].replicas"),
        ({"service": [{"name": "Echo!", "module": "m"}]}, "service[0].name"),
        ({"service": [{"name": "a", "module": "m"}, {"name": "a", "module": "m"}]}, "service[1].name"),
        ({"service": [{"name": "a", "module": "not a module"}]}, "service[0].module"),
        ({"service": [{"name": "a", "module": "m", "env": {"X": 1}}]}, "service[0].env"),
        ({"service": [{"name": "a", "module": "m", "ready_timeout_s": -1}]}, "service[0].ready_timeout_s"),
        ({"nats": {"port": 70000}}, "nats.port"),
        ({"nats": {"url": " "}}, "nats.url"),
        ({"nats": {"prot": 1}}, "nats.prot"),
        ({"cluster": {"stop_timeout_s": 0}}, "cluster.stop_timeout_s"),
        ({"services": []}, "services"),
    ],
)
def test_bad_values_name_the_key(doc: dict, key: str) -> None:
    with pytest.raises(SettingsError) as info:
        parse_cluster_config(doc, source="test.toml")
    assert info.value.key == key
    assert "test.toml" in str(info.value)


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="does not exist"):
        load_cluster_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[service]\n")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_cluster_config(bad)


def test_toml_round_trip_of_documented_example() -> None:
    # the example in the config module's docstring must parse
    from fireflyer.cluster import config

    doc = config.__doc__ or ""
    example = doc.split("::", 1)[1].split("Parsing is strict")[0]
    text = "\n".join(line[4:] for line in example.splitlines())
    cfg = parse_cluster_config(tomllib.loads(text))
    assert isinstance(cfg, ClusterConfig) and cfg.service[0].env == {"FF_LOG_LEVEL": "debug"}
