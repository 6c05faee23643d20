"""Defects found by an audit of the simulator (`rollwise simulate`), each with a hand-computed case."""

from __future__ import annotations

import argparse
import math

import pytest

from rollwise.sim.command import idle_settings, prepare, register
from rollwise.sim.world import SimParams, World


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd"))
    return parser.parse_args(["simulate", *argv])


def test_mean_length_is_the_mean_under_the_cap_hand_computed() -> None:
    """The default token budget is prompts x samples x the mean response length; the mean was the
    uncapped mean, then capped (min(E[X], cap), not E[min(X, cap)]): 4% too long at the default cap,
    16% at --max-len 512."""
    w = World(SimParams(n_train=4, n_eval=4, max_len=150, length_sigma=0.6, wrong_length_factor=1.5), 0, 2, 4)
    w.solvable[:] = False  # every response wrong: log-normal, median 100 * 1.5 = 150 = the cap
    w.log_med[:] = math.log(100.0)
    phi = 0.5 * (1 + math.erf(-0.6 / math.sqrt(2)))  # Phi((ln 150 - ln 150 - 0.36) / 0.6) = Phi(-0.6)
    expected = 150 * math.exp(0.18) * phi + 150 * 0.5  # E[X; X < cap] + cap * P(X >= cap) = 124.25
    assert w.mean_length() == pytest.approx(expected, rel=1e-9)
    assert w.mean_length() == pytest.approx(124.25, abs=0.01)


def test_length_ema_under_a_token_budget_is_not_called_idle() -> None:
    """--unit tokens gives every row a token budget, which reads length_ema: the warning that it
    has no effect ("it is read with a token budget: --unit tokens") was given under --unit tokens."""
    args = parsed("--strategies", "uniform", "mopps:length_ema=0.5", "--unit", "tokens")
    assert idle_settings(args, prepare(args)[0]) == []
    rollouts = parsed("--strategies", "uniform", "mopps:length_ema=0.5")
    assert [line.split(" has no effect")[0] for line in idle_settings(rollouts, prepare(rollouts)[0])] == [
        "strategy 'mopps:length_ema=0.5': length_ema"]


def test_an_oracle_that_no_part_reads_is_called_idle() -> None:
    """uniform:estimator=oracle gave a row identical to uniform's without a word (estimator=irt is
    warned of): uniform's and greso's selectors and allocators decide without the belief."""
    args = parsed("--strategies", "uniform", "uniform:estimator=oracle", "greso:estimator=oracle_seen",
                  "mopps:estimator=oracle", "adaptive:estimator=oracle_visit")
    assert [line.split(" has no effect")[0] for line in idle_settings(args, prepare(args)[0])] == [
        "strategy 'uniform:estimator=oracle': estimator=oracle",
        "strategy 'greso:estimator=oracle_seen': estimator=oracle_seen"]


@pytest.mark.parametrize("below", ["", "sub"])
def test_out_under_a_file_is_refused_before_simulating(tmp_path, capsys, below: str) -> None:
    """--out naming a file (or a folder under one) ran every simulation, then ended in a traceback
    (FileExistsError, NotADirectoryError) from mkdir, with nothing written."""
    f = tmp_path / "afile"
    f.write_text("x")
    args = parsed("--strategies", "uniform", "--seeds", "1", "--steps", "2", "--pool", "8", "--eval-size", "4",
                  "--prompts-per-step", "2", "--num-generations", "2", "--workers", "1", "--quiet",
                  "--out", str(f / below if below else f))
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "is a file, not a folder" in err
    assert f.read_text() == "x"
