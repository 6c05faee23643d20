"""The bench scripts' statistics checked by hand on made-up run folders (2026-12-07 audit): each test
fails on the code before its fix."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).parents[1] / "bench"


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


dp = _load("default_planner_audit", "default_planner.py")
pl = _load("planner_audit", "planner.py")


def _run(folder: Path, name: str, evals: dict[int, float], tokens: float = 1000.0, last_step: int = 40,
         config: str | None = None) -> None:
    """A default-job run folder: 40 steps (or last_step), evaluations at the given steps."""
    rows = [{"step": 0, "eval/accuracy": evals[0]}] if 0 in evals else []
    for s in range(1, last_step + 1):
        rows.append({"step": s, "time/step_s": 1.0, "rollout/tokens_total": tokens * s / 40, "rollout/rollouts_total": s,
                     "rollout/response_len_mean": 10.0, "rollout/reward_mean": 0.1})
        rows += [{"step": s, "eval/accuracy": evals[s]}] if s in evals else []
    (folder / name).mkdir(parents=True)
    (folder / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config is not None:
        (folder / name / "config.yaml").write_text(config)


def test_default_planner_a_run_killed_during_its_final_evaluation_is_not_finished(tmp_path, capsys):
    # a variant evaluating every 10 steps, killed after step 40 trained but before its final evaluation:
    # its last evaluation (step 30) is a mid-run one, not the "after" accuracy
    cfg = "train:\n  max_steps: 40\neval:\n  every_n_steps: 10\n  at_end: true\n"
    mid = {0: 0.2, 10: 0.25, 20: 0.3, 30: 0.35}
    name = dp.run_name("uniform:eval.every_n_steps=10", 1)
    _run(tmp_path, name, mid, config=cfg)
    assert dp.result(tmp_path / name) is None
    _run(tmp_path, "done", {**mid, 40: 0.32}, config=cfg)  # with it: finished, its final is the after
    assert dp.result(tmp_path / "done")["after"] == 0.32
    # and it is left out of both arms of the table
    _run(tmp_path, dp.run_name("adaptive:eval.every_n_steps=10", 1), {**mid, 40: 0.4}, config=cfg)
    assert dp.report(tmp_path, [1], ("uniform:eval.every_n_steps=10", "adaptive:eval.every_n_steps=10")) == 1
    assert "no finished pairs" in capsys.readouterr().out


def test_default_planner_a_seed_given_twice_is_counted_once(tmp_path, capsys):
    _run(tmp_path, "uniform-seed1", {0: 0.2, 40: 0.30})
    _run(tmp_path, "adaptive-seed1", {0: 0.2, 40: 0.34}, tokens=800)
    _run(tmp_path, "uniform-seed2", {0: 0.2, 40: 0.30})
    _run(tmp_path, "adaptive-seed2", {0: 0.2, 40: 0.28}, tokens=1200)
    assert dp.report(tmp_path, [1, 2, 1]) == 0
    out = capsys.readouterr().out
    # differences +4 and -2: mean +1.0, SD 4.24, SE 3.0; ratios 0.8 and 1.2; summed 2,000 / 2,000
    assert "adaptive - uniform +1.0 (SE 3.0" in out and "ahead on 1 of 2 seeds" in out
    assert "mean 1.00 (0.80-1.20), fewer on 1 of 2; summed over the seeds 1.00 (2,000 / 2,000)" in out
    assert out.count("| 1 | 20.0%") == 1


def test_default_planner_equal_differences_in_float_noise_are_the_same_difference(tmp_path, capsys):
    # +1 point on both seeds (83 - 80 and 97 - 94 of 300 items); as floats 0.010000000000000009 and
    # 0.009999999999999953, whose SD of 4e-17 made the mean "360287970189639.0 SE" from 0
    _run(tmp_path, "uniform-seed1", {0: 0.2, 40: 80 / 300})
    _run(tmp_path, "adaptive-seed1", {0: 0.2, 40: 83 / 300})
    _run(tmp_path, "uniform-seed2", {0: 0.2, 40: 94 / 300})
    _run(tmp_path, "adaptive-seed2", {0: 0.2, 40: 97 / 300})
    assert dp.report(tmp_path, [1, 2]) == 0
    assert "adaptive - uniform +1.0 (SE 0.0, the same difference on every seed" in capsys.readouterr().out


def test_planner_paired_header_says_the_arm_is_read_at_uniforms_tokens(tmp_path, capsys):
    # uniform ends at 0.30 after 1,000 tokens; the arm's last evaluation, 0.31, comes after 1,080 (the step
    # that crossed the budget): the paired cell is the arm at 1,000 tokens (0.2967) minus 0.30, not its final
    uni = {1: {"points": [[0, 0.2], [1000, 0.30]], "steps": 4, "effective_ratio": 0.5, "answer_length": None}}
    arm = {1: {"points": [[0, 0.2], [900, 0.28], [1080, 0.31]], "steps": 5, "effective_ratio": 0.5,
               "answer_length": None}}
    assert pl.paired_summary(uni, arm).split(" | ")[1].startswith("-0.3 ")  # final - uniform would be +1.0
    for strategy, runs in (("uniform", uni), ("adaptive", arm)):
        (tmp_path / f"{strategy}-seed1").mkdir()
        (tmp_path / f"{strategy}-seed1" / "curve.json").write_text(json.dumps({**runs[1], "strategy": strategy,
                                                                              "seed": 1}))
    assert pl.report(tmp_path) == 0
    capsys.readouterr()
    table = (tmp_path / "table.md").read_text()
    header = next(line for line in table.splitlines() if "| ahead on |" in line)
    assert "| at uniform's tokens - uniform's final (SE) |" in header and "| final - uniform" not in header
    assert "| adaptive | 1 | -0.3 (nan) | 0 of 1 |" in table
