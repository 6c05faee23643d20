"""A pure-numpy simulator of RLVR training dynamics for comparing rollout planners.

It replaces only the engine and the rewarder: planners are built by the same
`rollwise.planner.build_planner` and driven through the same begin_step/observe/end_step
conversation as in real training.
"""

from rollwise.sim.runner import RunResult, RunSpec, run_many, run_one
from rollwise.sim.world import LAWS, SimParams, World

__all__ = ["LAWS", "RunResult", "RunSpec", "SimParams", "World", "run_many", "run_one"]
