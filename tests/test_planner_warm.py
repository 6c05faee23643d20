"""planner.prior_counts: a planner's belief started from solve counts measured before training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rollwise.config import PlannerConfig, load_config
from rollwise.planner import build_planner
from rollwise.planner.warm import read_prior_counts

UIDS = [f"t:{i}" for i in range(40)]


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def make(prior: str | None, strategy: str = "adaptive", **kw):
    return build_planner(PlannerConfig(strategy=strategy, prior_counts=prior, **kw), UIDS, 4, 8, 64, 0)


def test_counts_become_the_estimators_belief(tmp_path: Path) -> None:
    f = write(tmp_path / "c.jsonl", [{"uid": "t:0", "successes": 16, "samples": 16},
                                     {"uid": "t:1", "successes": 0, "samples": 16},
                                     {"uid": "t:2", "successes": 8, "samples": 16},
                                     {"uid": "elsewhere:9", "successes": 1, "samples": 4}])
    pl = make(f)
    est = pl.estimator
    idx = np.arange(4)
    mean, count = est.mean(idx), est.count(idx)
    assert mean[0] > 0.9 and mean[1] < 0.1 and 0.35 < mean[2] < 0.65
    assert list(count) == [16, 16, 16, 0]  # t:3 was not listed; elsewhere:9 is not in the pool
    cold = make(None).estimator
    assert cold.count(idx).sum() == 0 and np.allclose(cold.mean(idx), cold.mean(idx)[0])
    # beta estimator: exactly Beta(1 + s, 1 + n - s)
    b = make(f, strategy="mopps").estimator
    assert b.alpha[:3].tolist() == [17, 1, 9] and b.beta[:3].tolist() == [1, 17, 9]


def test_warm_adaptive_commits_to_prompts_it_knows_are_informative(tmp_path: Path) -> None:
    # t:0-9 half solved, the other 30 never: a cold planner cannot tell them apart before rolling out
    rows = [{"uid": u, "successes": 8 if i < 10 else 0, "samples": 16} for i, u in enumerate(UIDS)]
    warm, cold = make(write(tmp_path / "c.jsonl", rows)), make(None)
    reqs = warm.begin_step(0)
    half = {f"t:{i}" for i in range(10)}
    full = [r.uid for r in reqs if r.n == 8]
    assert full and set(full) <= half  # full groups only for prompts known to be informative
    assert all(r.n < 8 for r in reqs if r.uid not in half)  # the others only probed, if chosen at all
    cold_reqs = cold.begin_step(0)
    assert len({r.n for r in cold_reqs}) == 1  # cold: every prompt treated alike


def test_warm_state_survives_checkpoint_and_resume(tmp_path: Path) -> None:
    f = write(tmp_path / "c.jsonl", [{"uid": "t:5", "successes": 3, "samples": 8}])
    warm = make(f)
    state = json.loads(json.dumps(warm.state_dict()))
    resumed = make(None)
    resumed.load_state_dict(state)
    assert resumed.estimator.count(np.array([5]))[0] == 8
    assert np.allclose(resumed.estimator.mean(np.arange(40)), warm.estimator.mean(np.arange(40)))


@pytest.mark.parametrize(("text", "says"), [
    ('{"uid": "t:0", "successes": 1}\n', "line 1"),
    ('\n{"uid": "t:0", "successes": 1, "samples": 4}\nnot json\n', "line 3"),
    ('{"uid": "t:0", "successes": 5, "samples": 4}\n', "0 <= successes <= samples"),
    ('{"uid": "t:0", "successes": 1.5, "samples": 4}\n', "whole numbers"),
    ('{"uid": "t:0", "successes": 1, "samples": 4}\n{"uid": "t:0", "successes": 1, "samples": 4}\n', "listed twice"),
])
def test_bad_rows_name_the_line_and_the_fix(tmp_path: Path, text: str, says: str) -> None:
    p = tmp_path / "c.jsonl"
    p.write_text(text)
    with pytest.raises(ValueError, match=says):
        read_prior_counts(p)


def test_missing_file_other_data_and_uniform_are_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no file"):
        make(str(tmp_path / "nope.jsonl"))
    other = write(tmp_path / "o.jsonl", [{"uid": "x:1", "successes": 1, "samples": 2}])
    with pytest.raises(ValueError, match="none of the 1 uids"):
        make(other)
    ok = write(tmp_path / "c.jsonl", [{"uid": "t:1", "successes": 1, "samples": 2}])
    with pytest.raises(ValueError, match="decides without it"):
        make(ok, strategy="uniform")


@pytest.mark.parametrize("strategy", ["uniform", "dapo", "greso", "dars", "ar3po"])
def test_strategies_that_never_read_the_belief_reject_counts(tmp_path: Path, strategy: str) -> None:
    """Their selectors and allocators keep their own counts (or none), so the counts would be ignored."""
    ok = write(tmp_path / "c.jsonl", [{"uid": "t:1", "successes": 1, "samples": 2}])
    with pytest.raises(ValueError, match=f"strategy '{strategy}'.*decides without it"):
        make(ok, strategy=strategy)


@pytest.mark.parametrize("strategy,part", [("mopps", {}), ("vade", {}), ("knapsack", {}), ("e3", {}),
                                           ("adaptive", {}), ("dapo", {"allocator": "knapsack"}),
                                           ("uniform", {"selector": "posterior"})])
def test_a_part_that_reads_the_belief_accepts_counts(tmp_path: Path, strategy: str, part: dict) -> None:
    ok = write(tmp_path / "c.jsonl", [{"uid": "t:1", "successes": 1, "samples": 2}])
    pl = make(ok, strategy=strategy, **part)
    assert pl.estimator.count(pl.indices(["t:1"]))[0] > 0


def test_config_option_by_its_cli_name(tmp_path: Path) -> None:
    cfg = load_config(None, [f"planner.prior_counts={tmp_path / 'c.jsonl'}"])
    assert cfg.planner.prior_counts == str(tmp_path / "c.jsonl")
