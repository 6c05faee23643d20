"""bench/default_planner.py deletes a finished run's checkpoints unless asked to keep them (a 10-seed
study kept about 60 GB and filled the disk, 2026-12-06)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("default_planner_bench",
                                              Path(__file__).parents[1] / "bench" / "default_planner.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _fake_run(cmd, **kw):
    name = next(a.split("=", 1)[1] for a in cmd if a.startswith("run.name="))
    out = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("run.output_dir=")))
    (out / name / "checkpoints" / "step_000040").mkdir(parents=True)


def test_a_finished_run_loses_its_checkpoints_unless_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(bench.subprocess, "run", _fake_run)
    bench.train(tmp_path, 20, "uniform")
    assert not (tmp_path / "uniform-seed20" / "checkpoints").exists()
    bench.train(tmp_path, 21, "adaptive", keep_checkpoints=True)
    assert (tmp_path / "adaptive-seed21" / "checkpoints" / "step_000040").is_dir()


def _finished(folder: Path, name: str, before: float, after: float, tokens: float) -> None:
    import json

    rows = [{"step": 0, "eval/accuracy": before}]
    rows += [{"step": s, "time/step_s": 1.0, "rollout/tokens_total": tokens * s / 40, "rollout/rollouts_total": s,
              "rollout/response_len_mean": 10.0} for s in range(1, 41)]
    rows.append({"step": 40, "eval/accuracy": after})
    (folder / name).mkdir(parents=True)
    (folder / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_pools_folders_and_gives_the_lower_bound_and_token_ratio(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _finished(a, "uniform-seed1", 0.2, 0.30, 1000)
    _finished(a, "adaptive-seed1", 0.2, 0.32, 800)
    _finished(b, "uniform-seed2", 0.2, 0.30, 1000)
    _finished(b, "adaptive-seed2", 0.2, 0.26, 1200)
    _finished(b, "uniform-seed3", 0.2, 0.30, 1000)
    _finished(b, "adaptive-seed3", 0.2, 0.33, 500)
    assert bench.report(a, [1, 2, 3], also=[b]) == 0
    out = capsys.readouterr().out
    # differences +2, -4, +3 points: mean +0.3, SD 3.79, SE 2.19; mean - 2 SE = -4.0
    assert "adaptive - uniform +0.3 (SE 2.2" in out and "mean - 2 SE -4.0" in out
    # token ratios 0.8, 1.2, 0.5: mean 0.83, fewer on 2 of 3
    assert "rollout tokens adaptive / uniform: mean 0.83 (0.50-1.20), fewer on 2 of 3" in out
    assert "summed over the seeds 0.83 (2,500 / 3,000)" in out  # (800 + 1200 + 500) / 3000
    assert bench.report(a, [1, 2, 3]) == 0  # without --also: seed 1 alone
    out = capsys.readouterr().out
    assert "adaptive - uniform +2.0" in out and "SE" not in out and "mean 0.80 (0.80-0.80), fewer on 1 of 1" in out


def test_a_run_finished_in_an_also_folder_is_reused_not_rerun(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or _fake_run(cmd, **kw))
    old, new = tmp_path / "old", tmp_path / "new"
    new.mkdir()
    _finished(old, "adaptive-seed1", 0.2, 0.30, 1000)
    bench.train(new, 1, "adaptive", also=[old])
    assert ran == [] and not (new / "adaptive-seed1").exists()
    bench.train(new, 2, "adaptive", also=[old])  # not finished anywhere: it runs
    assert len(ran) == 1 and "run.seed=2" in ran[0]
    (old / "adaptive-seed3" / "checkpoints").mkdir(parents=True)  # started, never finished: not reused
    (old / "adaptive-seed3" / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.2}\n')
    bench.train(new, 3, "adaptive", also=[old])
    assert len(ran) == 2 and "run.seed=3" in ran[1]


def test_a_dotted_variant_key_is_a_config_key_and_a_budget_stopped_run_counts_as_finished(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(bench.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or _fake_run(cmd, **kw))
    bench.train(tmp_path, 1, "adaptive:train.max_rollout_tokens=500:success_threshold=1.0")
    assert "train.max_rollout_tokens=500" in ran[0] and "planner.success_threshold=1.0" in ran[0]
    name = bench.run_name("adaptive:train.max_rollout_tokens=500", 2)
    _finished(tmp_path, name, 0.2, 0.3, 1000)  # 40 steps, 1000 tokens
    rows = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    cut = rows[:21] + ['{"step": 20, "eval/accuracy": 0.3}']  # stopped at step 20, 500 tokens
    (tmp_path / name / "metrics.jsonl").write_text("\n".join(cut) + "\n")
    assert bench.result(tmp_path / name) is None  # no config.yaml: a 40-step run, unfinished at 20
    (tmp_path / name / "config.yaml").write_text("train:\n  max_steps: 40\n  max_rollout_tokens: 600\n")
    assert bench.result(tmp_path / name) is None  # 500 tokens of a 600 budget: killed, not finished
    (tmp_path / name / "config.yaml").write_text("train:\n  max_steps: 40\n  max_rollout_tokens: 500\n")
    assert bench.result(tmp_path / name)["tokens"] == 500


def test_the_report_survives_a_line_cut_short_equal_differences_and_an_unfinished_run_in_out(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _finished(a, "uniform-seed1", 0.2, 0.30, 1000)
    _finished(a, "adaptive-seed1", 0.2, 0.31, 800)
    _finished(b, "uniform-seed2", 0.2, 0.30, 1000)
    _finished(b, "adaptive-seed2", 0.2, 0.31, 900)
    # seed 2 of adaptive was started again in `a` and killed mid-write: the finished one in `b` counts
    (a / "adaptive-seed2").mkdir()
    (a / "adaptive-seed2" / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.2}\n{"step": 1, "time/s')
    assert bench.result(a / "adaptive-seed2") is None  # unfinished, and the cut line does not raise
    assert bench.find_run([a, b], "adaptive-seed2") == b / "adaptive-seed2"
    assert bench.report(a, [1, 2], also=[b]) == 0
    out = capsys.readouterr().out
    # +1 point on both seeds: SE 0, no division by it
    assert "adaptive - uniform +1.0 (SE 0.0, the same difference on every seed" in out and "on 2 of 2 seeds" in out
