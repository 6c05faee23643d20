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
