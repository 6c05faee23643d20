"""bench/planner_partial.py: unfinished runs against uniform at equal tokens (hand-computed cases)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("planner_partial", Path(__file__).parents[1] / "bench" / "planner_partial.py")
partial = importlib.util.module_from_spec(spec)
spec.loader.exec_module(partial)


def write_run(folder: Path, tokens: list[float], evals: dict[int, float]) -> None:
    """tokens[i]: cumulative tokens after step i+1; evals: step -> accuracy."""
    folder.mkdir(parents=True)
    lines = [{"step": i + 1, "rollout/tokens_total": t} for i, t in enumerate(tokens)]
    lines += [{"step": s, "eval/accuracy": a} for s, a in evals.items()]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_at_tokens_interpolates_between_evaluations():
    pts = [(0.0, 0.10), (100.0, 0.20), (300.0, 0.40)]
    assert partial.at_tokens(pts, 50.0) == pytest.approx(0.15)
    assert partial.at_tokens(pts, 200.0) == pytest.approx(0.30)
    assert partial.at_tokens(pts, 500.0) == pytest.approx(0.40)  # beyond the last: the last


def test_compare_share_not_by_and_equal_token_difference(tmp_path):
    # uniform: 0.10 at 0, 0.20 at 100, 0.30 at 200 tokens (final 0.30 at 200)
    write_run(tmp_path / "uniform-seed1", [50, 100, 150, 200], {0: 0.10, 2: 0.20, 4: 0.30})
    write_run(tmp_path / "uniform-seed2", [50, 100, 150, 200], {0: 0.10, 2: 0.20, 4: 0.30})
    # seed 1 reaches 0.30 at 80 tokens (share 0.4) and is 0.05 above uniform at 120 tokens (0.22)
    write_run(tmp_path / "adaptive-seed1", [40, 80, 120], {0: 0.10, 2: 0.30, 3: 0.27})
    # seed 2 stopped at 150 tokens without reaching 0.30: "not by 0.75"; 0.20 - 0.25 = -0.05
    write_run(tmp_path / "adaptive-seed2", [75, 150], {0: 0.10, 2: 0.20})
    rows = partial.compare(tmp_path, "adaptive")
    assert "| 1 | 30.0% (200) | 120 | 27.0% at 120 | 0.40 | +5.0 | - |" in rows  # no planner metrics: no ratio
    assert "| 2 | 30.0% (200) | 150 | 20.0% at 150 | not by 0.75 | -5.0 | - |" in rows
    assert "share median above every share, at most 0.5 on 1 of 2" in rows[-1]
    assert "+0.0 points (SE 5.0), ahead on 1 of 2" in rows[-1]


def test_effective_samples_per_token(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    steps = [{"step": 1, "planner/trained_samples": 64, "planner/effective_ratio_trained": 0.5, "rollout/generated_tokens": 1000},
             {"step": 2, "planner/trained_samples": 32, "planner/effective_ratio_trained": 1.0, "rollout/generated_tokens": 600}]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in steps) + "\n")
    assert partial.effective_per_token(d) == pytest.approx((32 + 32) / 1600)
