"""Defects found by a second audit of the simulator (`rollwise simulate`), each with a case that failed before."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from rollwise.planner import Request
from rollwise.sim.command import idle_settings, prepare
from rollwise.sim.world import SimParams, World
from tests.test_sim_audit import parsed


def test_the_idle_check_does_not_warn_of_a_cooldown_against_its_own_toy_pool() -> None:
    """idle_settings builds each row's planner on a toy pool of 8 prompts x 4 a step to see what it reads; building
    it warned 'revisit_cooldown=4 can keep 4 x 4 prompts ... not fewer than the pool's 8 ... give a cooldown below 2'
    for a pool of 1024 at 32 a step (128 out at once: fine), advice about a pool the user never gave."""
    args = parsed("--strategies", "uniform", "adaptive:revisit_cooldown=4")
    rows = prepare(args)[0]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert idle_settings(args, rows) == []
    assert [str(w.message) for w in seen] == []


@pytest.mark.parametrize("row, says", [
    ("adaptive:max_samples_per_prompt=4", "max_samples_per_prompt (4) is below"),  # against --num-generations 8
    ("adaptive:prior_counts={missing}", "no file"),
    ("adaptive:prior_counts={other}", "none of the 1 uids"),  # measured on another pool's uids
])
def test_a_row_that_only_building_its_planner_refuses_is_an_error_before_any_row_runs(tmp_path, capsys, monkeypatch,
                                                                                      row, says) -> None:
    """A row field that the planner refuses only when built (a group cap below the group size, a prior_counts file
    that is missing or names none of the simulated prompts) ended the command in a traceback, after every row
    before it had run all its seeds (or inside a worker pool): now an error and exit 2 before the first run."""
    other = tmp_path / "other.jsonl"
    other.write_text('{"uid": "gsm8k:train:1", "successes": 1, "samples": 4}\n')
    import rollwise.sim.command as command

    ran, orig = [], command.run_many
    monkeypatch.setattr(command, "run_many", lambda *a, **k: ran.append(a[1]) or orig(*a, **k))
    args = parsed("--strategies", "uniform", row.format(missing=tmp_path / "nope.jsonl", other=other), "--seeds", "1",
                  "--steps", "2", "--pool", "16", "--eval-size", "4", "--prompts-per-step", "2", "--workers", "1",
                  "--quiet", "--out", str(tmp_path / "out"))
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("rollwise simulate: error: strategy 'adaptive:") and says in err
    assert ran == []  # uniform did not run first
    # a file of the simulated prompts' own uids is read (bench/sim_prior.py writes such files)
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"uid": "t1", "successes": 1, "samples": 4}\n')
    ok = parsed("--strategies", "uniform", f"adaptive:prior_counts={mine}", "--seeds", "1", "--steps", "2", "--pool", "16",
                "--eval-size", "4", "--prompts-per-step", "2", "--workers", "1", "--quiet", "--out", str(tmp_path / "out"))
    assert ok.func(ok) == 0


@pytest.mark.parametrize("flag", [("--skill0", "-800"), ("--difficulty-sd", "600")])
def test_a_world_far_below_any_solve_rate_gives_rates_of_zero_not_an_overflow(tmp_path, flag) -> None:
    """World.generate computed 1 / (1 + math.exp(-z)), which raises OverflowError ('math range error') once the
    logit z is below about -709 (--skill0 -800, or a prompt 300+ logits hard): a traceback mid-run. solve_rate's
    numpy exp gave 'overflow encountered in exp' warnings on every evaluation."""
    args = parsed("--strategies", "uniform", "adaptive", *flag, "--seeds", "1", "--steps", "2", "--pool", "64",
                  "--eval-size", "32", "--prompts-per-step", "8", "--workers", "1", "--quiet", "--out", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert args.func(args) == 0
    w = World(SimParams(n_train=8, n_eval=4, skill0=-800.0, unsolvable=0.0), 0, 2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert w.generate(Request("t0", 8)).rewards == [0.0] * 8 and w.eval_accuracy() < 1e-300
    normal = World(SimParams(n_train=8, n_eval=4, unsolvable=0.0), 0, 2, 4)  # an ordinary logit: the same rate
    z = normal._logit(np.arange(8))
    assert np.array_equal(normal.solve_rate(np.arange(8)), 1.0 / (1.0 + np.exp(-z)) * normal.fit[:8])


def test_the_same_world_without_the_run_keeps_the_prompt_feature(capsys) -> None:
    """print_fit's 'the same world without the run' command repeats every world flag set away from its default
    (--law, --drift, --max-len, ...) but not --feature-r2: the printed world had no prompt feature."""
    from rollwise.sim.command import fill_defaults, print_fit
    from rollwise.sim.fit import Visit, fit_world

    w = World(SimParams(n_train=200, unsolvable=0.0, skill0=-1.0, difficulty_sd=1.0), 0, 8, 8)
    rng = np.random.default_rng(0)
    q = w.solve_rate(np.arange(200))
    visits = [Visit("k0", "".join("1" if x else "0" for x in rng.random(8) < q[i]), 1) for i in range(200)]
    fit = fit_world(visits)
    args = parsed("--feature-r2", "0.4", "--drift", "0.1", "--strategies", "uniform", "adaptive:length_prior=true")
    args.fit = [Path("runs/x")]
    args.skill0, args.difficulty_sd, args.unsolvable, args.tasks = fit.skill0, fit.difficulty_sd, fit.unsolvable, 0
    args.polarise, args.polarise_law = 0.0, "scale"
    fill_defaults(args)
    print_fit(args, fit, visits)
    line = next(x for x in capsys.readouterr().out.splitlines() if "the same world without the run" in x)
    assert "--drift 0.1" in line and "--feature-r2 0.4" in line


def test_prior_counts_next_to_the_full_oracle_is_refused_like_the_other_estimator_options(tmp_path) -> None:
    """estimator=oracle replaces the estimator, so options that shape it are refused (docs/planner.md); prior_counts,
    which starts it from a file, was accepted and silently thrown away with it (the row equal to the plain oracle's).
    oracle_seen and oracle_visit keep the warm-started belief for unseen prompts: still accepted there."""
    counts = tmp_path / "counts.jsonl"
    counts.write_text('{"uid": "t1", "successes": 1, "samples": 4}\n')
    args = parsed("--strategies", "uniform", f"adaptive:prior_counts={counts}:estimator=oracle", "--pool", "16")
    with pytest.raises(ValueError, match="estimator=oracle replaces the estimator, so prior_counts has no effect"):
        prepare(args)
    seen = parsed("--strategies", "uniform", f"adaptive:prior_counts={counts}:estimator=oracle_seen", "--pool", "16")
    assert len(prepare(seen)[0]) == 2


def test_a_row_with_prior_counts_still_gets_its_idle_field_warnings(tmp_path) -> None:
    """idle_settings builds each row's planner on a toy pool of uids u0..u7; a row's prior_counts file names the
    simulated prompts (t0, t1, ...), none of them in the toy pool, so the build failed and the row was skipped
    without a word: success_threshold (or seed, length_ema) next to prior_counts was never called idle."""
    counts = tmp_path / "counts.jsonl"
    counts.write_text('{"uid": "t1", "successes": 1, "samples": 4}\n')
    args = parsed("--strategies", "uniform", f"adaptive:prior_counts={counts}:success_threshold=0.5", "--pool", "16")
    lines = idle_settings(args, prepare(args)[0])
    assert [x.split(" has no effect")[0] for x in lines] == [
        f"strategy 'adaptive:prior_counts={counts}:success_threshold=0.5': success_threshold"]


def test_an_estimator_option_beside_the_full_oracle_names_the_oracle_not_the_presets_estimator():
    """adaptive:estimator=oracle:estimator_window=8 said "strategy 'adaptive' uses estimator 'irt'": the estimator
    the user had replaced."""
    from rollwise.sim.command import parse_strategy

    with pytest.raises(ValueError, match="estimator=oracle replaces the estimator, so estimator_window has no effect"):
        parse_strategy("adaptive:estimator=oracle:estimator_window=8")


def test_a_row_that_made_uniforms_decisions_on_every_seed_is_named(capsys, tmp_path):
    """At a short horizon over a large pool no prompt comes back, and greso (which skips by a prompt's history) gave
    exactly uniform's numbers in every column without a word: a reader took it for a measured tie."""
    from test_sim_audit import parsed

    args = parsed("--strategies", "uniform", "greso", "adaptive", "--seeds", "2", "--steps", "3", "--workers", "1",
                  "--quiet", "--out", str(tmp_path))
    assert args.func(args) == 0
    err = capsys.readouterr().err
    assert "'greso' made uniform's decisions on every seed" in err, err
    assert "'adaptive' made uniform's" not in err  # it probes new prompts: other decisions from the first step
