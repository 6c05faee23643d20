"""bench/paired_finals.py's paired mean and standard error, hand-computed."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

spec = importlib.util.spec_from_file_location("paired_finals", Path(__file__).parents[1] / "bench" / "paired_finals.py")
pf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pf)


def test_paired_mean_and_standard_error():
    mean, se = pf.paired([1.0, 3.0, 5.0])  # sd 2, n 3
    assert mean == 3.0 and math.isclose(se, 2 / math.sqrt(3))
    assert math.isnan(pf.paired([2.0])[1])


def test_final_accuracy_is_the_last_evaluation(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.2}\n{"step": 1, "rollout/x": 1}\n'
                                            '{"step": 3, "eval/accuracy": 0.25}\n')
    assert pf.final_accuracy(tmp_path) == 0.25


def test_an_unfinished_run_is_left_out_with_a_note(tmp_path, capsys):
    import json

    def run(folder, name, evals, steps, max_steps=4):
        d = tmp_path / folder / name
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(f"train:\n  max_steps: {max_steps}\n")
        rows = [{"step": s, "rollout/tokens_total": 10.0 * s, "rollout/reward_mean": 0.1} for s in range(1, steps + 1)]
        rows += [{"step": s, "eval/accuracy": acc} for s, acc in evals]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    run("x", "adaptive-seed1", [(0, 0.2), (4, 0.30)], 4)
    run("y", "adaptive-seed1", [(0, 0.2), (4, 0.28)], 4)
    run("x", "adaptive-seed2", [(0, 0.2), (2, 0.22)], 3)  # killed at step 3: its last evaluation is mid-run
    run("x", "adaptive-seed3", [(0, 0.2), (2, 0.30)], 3)  # stopped early at step 3: finished
    (tmp_path / "x" / "adaptive-seed3" / "config.yaml").write_text("train:\n  max_steps: 4\neval:\n  early_stopping_patience: 1\n")
    with open(tmp_path / "x" / "adaptive-seed3" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 3, "eval/evals_since_best": 1}) + "\n")
    run("y", "adaptive-seed3", [(0, 0.2), (4, 0.25)], 4)
    run("y", "adaptive-seed2", [(0, 0.2), (4, 0.26)], 4)
    assert pf.main([str(tmp_path / "x"), str(tmp_path / "y"), "--arms", "adaptive", "--seeds", "1", "2", "3"]) == 0
    cap = capsys.readouterr()
    assert "| adaptive | 2 | +3.5 (1.5) | 2 of 2 |" in cap.out
    assert "seed 2 of adaptive left out" in cap.err and "x/adaptive-seed2 did not finish" in cap.err
