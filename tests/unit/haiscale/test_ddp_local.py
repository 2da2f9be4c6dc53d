"""haiscale DDP's reducer on one rank with an in-process stand-in communicator (no worker).

The stand-in reduces over a world of one (the result is the input), records what was
submitted, and completes an op only when waited for, so the tests see the reducer's
order of submissions and waits; the multi-rank behaviour is tested under ff launch
(tests/integration/haiscale).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fireflyer.core.errors import FailedPrecondition, InvalidArgument, Unimplemented  # noqa: E402
from fireflyer.haiscale.backend import HFReduceProcessGroup  # noqa: E402
from fireflyer.haiscale.ddp import DistributedDataParallel, UnreadyGradients  # noqa: E402
from fireflyer.haiscale.hooks import bf16_compress_hook  # noqa: E402


class LocalWork:
    def __init__(self, comm: LocalComm, x: Any) -> None:
        self.comm, self.x, self.done = comm, x, False

    def wait(self) -> Any:
        self.done = True
        self.comm.log.append(("wait", id(self.x)))
        return self.x

    def is_completed(self) -> bool:
        return True


class LocalComm:
    """A world of one: every collective leaves its buffer as it is."""

    rank, world_size = 0, 1

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def empty(self, n: int, dtype: Any) -> np.ndarray:
        return np.zeros(n, dtype)

    def _op(self, kind: str, x: Any, async_op: bool) -> Any:
        self.log.append((kind, None if x is None else tuple(np.shape(x))))
        w = LocalWork(self, x)
        return w if async_op else w.wait()

    def allreduce(self, x: Any, op: str = "sum", async_op: bool = False) -> Any:
        return self._op("allreduce", x, async_op)

    def broadcast(self, x: Any, root: int, async_op: bool = False) -> Any:
        return self._op("broadcast", x, async_op)

    def reduce(self, x: Any, root: int, op: str = "sum", async_op: bool = False) -> Any:
        return self._op("reduce", x, async_op)

    def barrier(self, async_op: bool = False) -> Any:
        return self._op("barrier", None, async_op)

    def allgather(self, out: Any, x: Any, async_op: bool = False) -> Any:
        out[...] = x  # one rank: its own slice is the whole output
        return self._op("allgather", out, async_op)

    def reduce_scatter(self, out: Any, x: Any, op: str = "sum", async_op: bool = False) -> Any:
        out[...] = x
        return self._op("reduce_scatter", out, async_op)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 300)
        self.b = torch.nn.Linear(300, 300)
        self.side = torch.nn.Linear(300, 2)
        self.c = torch.nn.Linear(300, 2)

    def forward(self, x: Any, side: bool = True) -> Any:
        h = self.b(torch.relu(self.a(x)))
        return self.c(h) + (self.side(h) if side else 0)


def step(m: Any, side: bool = True, seed: int = 0) -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
    m(x, side=side).sum().backward()


def test_gradients_match_the_plain_model_and_land_in_grad() -> None:
    torch.manual_seed(0)
    plain = Net()
    ddp = DistributedDataParallel(Net(), comm=LocalComm(), bucket_cap_mb=0.1, first_bucket_mb=0.01)
    ddp.module.load_state_dict(plain.state_dict())
    assert len(ddp.reducer.plan.buckets) >= 3
    for seed in range(2):
        plain.zero_grad()
        ddp.module.zero_grad()
        step(plain, seed=seed)
        step(ddp, seed=seed)
        for (n, p), q in zip(plain.named_parameters(), ddp.module.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad), n


def test_buckets_go_out_in_order_and_backward_waits_for_all_of_them() -> None:
    comm = LocalComm()
    ddp = DistributedDataParallel(Net(), comm=comm, bucket_cap_mb=0.1, first_bucket_mb=0.01)
    step(ddp)  # first step: agreement, then the buckets
    comm.log.clear()
    step(ddp)
    n = len(ddp.reducer.plan.buckets)
    sizes = [("allreduce", (b.numel,)) for b in ddp.reducer.plan.buckets]
    # later steps: each bucket is submitted as it fills (in order), and all are waited for at the end
    assert [e for e in comm.log if e[0] == "allreduce"] == sizes
    assert len([e for e in comm.log if e[0] == "wait"]) == n
    first_wait = next(i for i, e in enumerate(comm.log) if e[0] == "wait")
    assert first_wait == n  # nothing waited for until every bucket had been submitted


def test_a_skipped_parameter_is_named() -> None:
    ddp = DistributedDataParallel(Net(), comm=LocalComm())
    with pytest.raises(UnreadyGradients, match=r"'side.weight' \(gradient on ranks none, none on ranks \[0\]\)"):
        step(ddp, side=False)
    step(ddp)  # the reducer is usable again
    with pytest.raises(UnreadyGradients, match="rank 0: parameters 'side.weight', 'side.bias' got no gradient"):
        step(ddp, side=False)


def test_find_unused_parameters_leaves_a_globally_unused_grad_none() -> None:
    ddp = DistributedDataParallel(Net(), comm=LocalComm(), find_unused_parameters=True)
    step(ddp, side=False)
    assert ddp.module.side.weight.grad is None and ddp.module.c.weight.grad is not None


def test_no_sync_submits_nothing_and_accumulates() -> None:
    comm = LocalComm()
    ddp = DistributedDataParallel(Net(), comm=comm)
    comm.log.clear()
    with ddp.no_sync():
        step(ddp)
    assert comm.log == []
    g1 = ddp.module.c.weight.grad.clone()
    step(ddp)
    assert torch.allclose(ddp.module.c.weight.grad, 2 * g1)
    assert any(e[0] == "allreduce" for e in comm.log)


def test_comm_hook_rules_and_compression() -> None:
    ddp = DistributedDataParallel(Net(), comm=LocalComm())
    ddp.register_comm_hook(None, bf16_compress_hook)
    with pytest.raises(FailedPrecondition, match="already registered"):
        ddp.register_comm_hook(None, bf16_compress_hook)
    step(ddp)
    g = ddp.module.b.weight.grad
    assert torch.equal(g, g.to(torch.bfloat16).float())  # it travelled as bfloat16
    with pytest.raises(FailedPrecondition, match="before the first backward"):
        DistributedDataParallel.register_comm_hook(ddp, None, bf16_compress_hook)


def test_gradient_as_bucket_view() -> None:
    ddp = DistributedDataParallel(Net(), comm=LocalComm(), gradient_as_bucket_view=True)
    step(ddp)
    for i, p in enumerate(ddp.reducer.params):
        assert p.grad.data_ptr() == ddp.reducer.slot(i).data_ptr()


def test_stop_removes_the_hooks() -> None:
    comm = LocalComm()
    ddp = DistributedDataParallel(Net(), comm=comm)
    ddp.stop()
    comm.log.clear()
    step(ddp)
    assert comm.log == [] and ddp.module.c.weight.grad is not None


def test_bad_arguments_name_what_is_wrong() -> None:
    with pytest.raises(InvalidArgument, match="pass comm="):
        DistributedDataParallel(Net(), comm=LocalComm(), process_group=object())
    with pytest.raises(InvalidArgument, match=r"'a.weight'.*float64"):
        DistributedDataParallel(Net().double(), comm=LocalComm())


def test_backend_ops_it_lacks_raise_naming_the_op() -> None:
    import torch.distributed as dist
    from torch._C._distributed_c10d import AllreduceOptions

    pg = HFReduceProcessGroup(LocalComm(), 0, 1)
    with pytest.raises(Unimplemented, match="does not implement send"):
        pg.send([torch.zeros(1)], 0, 0)
    with pytest.raises(Unimplemented, match="does not implement all_to_all_single"):
        pg.all_to_all_single(torch.zeros(1), torch.zeros(1), [], [])
    opts = AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.PRODUCT
    with pytest.raises(Unimplemented, match="no reduce op PRODUCT"):
        pg.allreduce([torch.zeros(1)], opts)
    out = [[torch.zeros(3)]]
    pg.allgather(out, [torch.arange(3.0)]).wait()
    assert out[0][0].tolist() == [0.0, 1.0, 2.0]
    fut = pg.allreduce([torch.ones(2)], AllreduceOptions()).get_future()
    assert fut.wait()[0].tolist() == [1.0, 1.0]


def test_haiscale_shim_and_backend_registration() -> None:
    import tomllib
    from pathlib import Path

    import torch.distributed as dist

    import haiscale.ddp
    import haiscale.hooks
    from fireflyer.haiscale import ddp, hooks

    assert haiscale.ddp.DistributedDataParallel is ddp.DistributedDataParallel
    assert haiscale.hooks.bf16_compress_hook is hooks.bf16_compress_hook
    assert "HFREDUCE" in dist.Backend._plugins  # importing the package registered the backend
    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    assert "haiscale*" in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
