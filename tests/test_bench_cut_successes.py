"""bench/cut_successes.py's shares, hand-computed."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("cut_successes", Path(__file__).parents[1] / "bench" / "cut_successes.py")
cuts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cuts)


def test_shares_of_cut_answers_among_the_correct_ones():
    history = [
        {"step": 0, "eval/accuracy": 0.2},
        {"step": 1, "rollout/groups": [["a", "1100", [48, 10, 48, 48]], ["b", "00", [5, 6]]]},
        {"step": 4, "rollout/groups": [["a", "1010", [48, 48, 20, 30]]]},
    ]
    got = cuts.cut_shares(history, cap=48)
    assert got["early"] == 0.5  # step 1: correct answers of 48 and 10 tokens, one cut
    assert got["all"] == 2 / 4  # plus step 4: correct at 48 (cut) and 20
    assert got["cut"] == 2 / 5  # cut answers: 48 (1), 48 (0), 48 (0) at step 1, 48 (1), 48 (0) at step 4
    assert math.isnan(cuts.cut_shares([{"step": 1, "rollout/groups": [["b", "00", [5, 6]]]}], cap=48)["all"])


def test_rank_correlation_gives_ties_their_mean_rank_and_drops_nan_pairs():
    # x ranks 2, 2, 2, 4 against y 1, 2, 3, 4: Spearman with mean ranks is 0.775, whatever y's order in the ties
    assert cuts._rank_corr([0.1, 0.1, 0.1, 0.4], [1, 2, 3, 4]) == pytest.approx(0.7746, abs=1e-4)
    assert cuts._rank_corr([0.1, 0.1, 0.1, 0.4], [3, 2, 1, 4]) == pytest.approx(0.7746, abs=1e-4)
    # a NaN pair is left out, not ranked as the largest value
    assert cuts._rank_corr([float("nan"), 0.1, 0.2, 0.3], [4, 1, 2, 3]) == pytest.approx(1.0)
    assert cuts._rank_corr([float("nan"), 0.1, 0.2, 0.3], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(cuts._rank_corr([0.1, 0.2], [1, 2]))
