"""hfreduce.init(): the environment of DESIGN.md §3, explicit arguments winning, clear errors."""

from __future__ import annotations

import pytest

from fireflyer import hfreduce
from fireflyer.core.errors import InvalidArgument, Unavailable


def test_client_init_names_missing_variables() -> None:
    with pytest.raises(InvalidArgument, match="FF_RANK.*FF_HFREDUCE_SOCKET"):
        hfreduce.init(env={})


def test_client_init_rejects_bad_values() -> None:
    env = {"FF_RANK": "x", "FF_WORLD_SIZE": "2", "FF_LOCAL_RANK": "0", "FF_LOCAL_WORLD_SIZE": "2",
           "FF_NODE_RANK": "0", "FF_NNODES": "1", "FF_HFREDUCE_SOCKET": "/nonexistent/s"}
    with pytest.raises(InvalidArgument, match="FF_RANK"):
        hfreduce.init(env=env)
    with pytest.raises(InvalidArgument, match="world size 3"):
        hfreduce.init(env={**env, "FF_RANK": "0"}, world_size=3)


def test_client_init_without_worker_is_unavailable(tmp_path) -> None:
    env = {"FF_RANK": "0", "FF_WORLD_SIZE": "1", "FF_LOCAL_RANK": "0", "FF_LOCAL_WORLD_SIZE": "1",
           "FF_NODE_RANK": "0", "FF_NNODES": "1", "FF_HFREDUCE_SOCKET": str(tmp_path / "none.sock")}
    with pytest.raises(Unavailable, match="no HFReduce worker"):
        hfreduce.init(env=env, connect_timeout_s=0.2)
