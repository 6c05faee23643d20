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
