"""bench/sim_prior.py's warm-start file and count histogram."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rollwise.planner.warm import read_prior_counts
from rollwise.sim.runner import RunSpec
from rollwise.sim.world import SimParams

BENCH = Path(__file__).parents[1] / "bench"


@pytest.fixture(scope="module")
def prior():
    sys.path.insert(0, str(BENCH))  # sim_prior imports bench/sim_reach.py as a sibling
    try:
        spec = importlib.util.spec_from_file_location("sim_prior", BENCH / "sim_prior.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_histogram_bins_scale_with_the_draws(prior):
    # of 16: 0 | 1 | 2-3 | 4-7 | 8-16
    assert prior.histogram(np.array([0, 0, 1, 3, 4, 16]), 16) == pytest.approx([2 / 6, 1 / 6, 1 / 6, 1 / 6, 1 / 6])
    # of 8, as rates: 0 | (0, 1/16] holds no count of 8 | 1 (1/8) | 2-3 (2/8, 3/8) | 4-8; each count in one bin
    assert prior.histogram(np.array([0, 8]), 8) == pytest.approx([0.5, 0, 0, 0, 0.5])
    assert prior.histogram(np.arange(9), 8) == pytest.approx([1 / 9, 0, 1 / 9, 2 / 9, 5 / 9])
    for samples in (4, 8, 12, 16, 32):  # the shares always sum to 1 (the old scaled edges overlapped)
        assert sum(prior.histogram(np.arange(samples + 1), samples)) == pytest.approx(1.0)


def test_counts_file_follows_the_worlds_rates(prior, tmp_path):
    spec = RunSpec("adaptive", 3, params=replace(SimParams(), n_train=50, n_eval=10, unsolvable=1.0))
    counts = read_prior_counts(prior.counts_file(spec, 16, tmp_path))
    assert len(counts) == 50 and all(c == (0, 16) for c in counts.values())  # nothing is solvable
    easy = RunSpec("adaptive", 3, params=replace(SimParams(), n_train=50, n_eval=10, skill0=8.0, difficulty_sd=0.1, unsolvable=0.0,
                                                  max_len=10_000))
    rows = [json.loads(line) for line in Path(prior.counts_file(easy, 16, tmp_path)).read_text().splitlines()]
    assert np.mean([r["successes"] for r in rows]) > 15  # a skill far above every prompt solves nearly all
