"""The node agent's half of validation: run the validator's checks on this node when the health
service asks (``NodeAgent.Validate``).

The checks (:func:`fireflyer.health.checks.run_level`) are CPU-, memory- and GPU-bound and take
seconds to hours, so they run in a worker thread (numpy and the numba kernels release the GIL): the
agent's event loop keeps heartbeating, registering and serving its tasks meanwhile.  One validation
at a time per node (two would measure each other); a second request while one runs is refused with
FAILED_PRECONDITION rather than queued, so the caller decides.  The baseline, sizes, inventory and
injected faults come from the health service, which keeps them; the agent keeps nothing.

Without a file system or an HFReduce communicator the storage and allreduce checks are listed as
not run (the health service runs them where it can give them one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import msgspec

from fireflyer.core.errors import FailedPrecondition, InvalidArgument
from fireflyer.health.checks import INJECTIONS, LEVELS, Baseline, LevelPlan, NodeReport, NodeSpec, run_level

__all__ = ["NodeValidator"]


class NodeValidator:
    """Runs one validation at a time on this node."""

    def __init__(self, node: str, *, sysfs_root: str = "/sys") -> None:
        self.node = node
        self.sysfs_root = sysfs_root
        self._busy = False

    @property
    def busy(self) -> bool:
        return self._busy

    @staticmethod
    def check_request(level: int, inject: Mapping[str, str], plan_json: bytes, spec_json: bytes,
                      fraction: float) -> tuple[LevelPlan | None, NodeSpec | None]:
        """InvalidArgument naming the field for what the runner would refuse; the decoded plan and spec."""
        if level not in LEVELS:
            raise InvalidArgument(f"level must be one of {sorted(LEVELS)}, got {level}", field="level")
        for check, fault in inject.items():
            if fault not in INJECTIONS.get(check, ()):
                raise InvalidArgument(f"cannot inject {fault!r} into {check!r}; known: "
                                      + ", ".join(f"{c}={'|'.join(f)}" for c, f in INJECTIONS.items()),
                                      field="inject")
        if fraction < 0 or fraction > 1:
            raise InvalidArgument(f"baseline_fraction must be in [0, 1], got {fraction}", field="baseline_fraction")
        try:
            plan = msgspec.json.decode(plan_json, type=LevelPlan) if plan_json else None
        except msgspec.ValidationError as e:
            raise InvalidArgument(f"plan_json is not a LevelPlan: {e}", field="plan_json") from e
        try:
            spec = msgspec.json.decode(spec_json, type=NodeSpec) if spec_json else None
        except msgspec.ValidationError as e:
            raise InvalidArgument(f"spec_json is not a NodeSpec: {e}", field="spec_json") from e
        return plan, spec

    async def validate(self, level: int, *, baseline: Mapping[str, float], fraction: float,
                       inject: Mapping[str, str], plan_json: bytes = b"", spec_json: bytes = b"") -> NodeReport:
        plan, spec = self.check_request(level, inject, plan_json, spec_json, fraction)
        if self._busy:
            raise FailedPrecondition(f"node {self.node} is already running a validation; wait for it to finish",
                                     node=self.node)
        self._busy = True
        try:
            base = Baseline(values=dict(baseline), fraction=fraction or 0.5)
            return await asyncio.to_thread(run_level, level, spec or NodeSpec(name=self.node), base,
                                           inject=dict(inject), sysfs_root=self.sysfs_root, plan=plan)
        finally:
            self._busy = False
