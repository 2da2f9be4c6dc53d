"""Parallel-configuration planner: AxoNN's 4D communication model with memory and compute terms,
cluster topology presets, and HFReduce's allreduce bandwidth model (see docs/planner.md)."""

from fireflyer.planner.comm import DimTimes, Grid, step_comm
from fireflyer.planner.models import MODELS, ModelShape, model_named
from fireflyer.planner.search import Candidate, Plan, PlanRequest, plan
from fireflyer.planner.topology import TOPOLOGIES, Topology, topology_named

__all__ = ["DimTimes", "Grid", "step_comm", "MODELS", "ModelShape", "model_named", "Candidate", "Plan",
           "PlanRequest", "plan", "TOPOLOGIES", "Topology", "topology_named"]
