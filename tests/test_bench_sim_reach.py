"""bench/sim_reach.py's share and target rule, hand-computed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from rollwise.sim.runner import RunResult

spec = importlib.util.spec_from_file_location("sim_reach", Path(__file__).parents[1] / "bench" / "sim_reach.py")
reach = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reach)


def result(rollouts, accuracy, effective=0, generated=1):
    r = np.array(rollouts, dtype=float)
    return RunResult("x", 0, r, r, np.array(accuracy), effective, generated, 0.0, 0.0, 0, float(r[-1]))


def test_share_is_where_uniforms_final_is_first_reached_and_marks_never():
    base = {0: result([0, 50, 100], [0.1, 0.2, 0.3]), 1: result([0, 100], [0.1, 0.5])}
    # seed 0 is at 0.4 >= 0.3 after its first step, which ends at 30 rollouts: 30 of 100
    arm = {0: result([0, 30, 100], [0.1, 0.4, 0.4]), 1: result([0, 100], [0.1, 0.45])}
    sh = reach.shares(arm, base)
    assert sh[0] == pytest.approx(0.3) and np.isnan(sh[1])
    assert reach.share_text(sh) == "never (1/2)"
    assert reach.share_text(sh[:1]) == "0.30"


def test_target_needs_every_seed_a_third_and_effective_ratio():
    assert reach.meets_target(np.array([0.2, 0.4]), 0.9)  # mean 0.30
    assert not reach.meets_target(np.array([0.3, 0.4]), 0.95)  # mean 0.35
    assert not reach.meets_target(np.array([0.2, 0.3]), 0.89)
    assert not reach.meets_target(np.array([0.1, np.nan]), 0.99)
