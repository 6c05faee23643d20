"""A run stopped after its checkpoint at step k and resumed is the run not stopped.

Each case trains one tiny run to the end with a checkpoint after every step, copies its folder, removes the
copy's checkpoints after step k (what a run killed between checkpoints k and k + 1 leaves behind, metrics of
the later steps included, and a line cut short) and resumes the copy. Its metrics (timing left out), the
planner's notes on stderr, and the final checkpoint (weights, optimizer, RNG, planner, engine and executor
state) must equal the uninterrupted run's.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from test_e2e import _args

from rollwise.cli import main
from rollwise.training.checkpoint import checkpoint_step, latest_checkpoint

TESTS = Path(__file__).parent
QUIET = ("eval.at_start=false", "eval.at_end=false")
SMALL_POOL = ("data.train_size=8",)  # 4 prompts a step: every prompt comes back every other step


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _untimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row but the start's and resumes' (time/setup_s), without timings (time/*, async/*_wait_s, tokens_per_s)."""
    return [{k: v for k, v in r.items() if not (k.startswith("time/") or k.endswith(("_s", "_per_s")))}
            for r in rows if "time/setup_s" not in r]


def _step_notes(err: str, after: int) -> list[str]:
    """The lines `rollwise: step N: ...` said for steps after `after`."""
    return [m.group(0) for m in re.finditer(r"^rollwise: step (\d+): .*$", err, re.M) if int(m.group(1)) > after]


def _same(a: Any, b: Any, where: str = "") -> None:
    """Deep equality of checkpoint states (tensors, numpy arrays, containers), saying where they differ."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and torch.equal(a, b), where
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert np.array_equal(np.asarray(a), np.asarray(b)), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, sorted(set(a) ^ set(b), key=str))
        for k in a:
            if isinstance(k, str) and (k.endswith("_s") or k in ("s_per_token",)):  # timings
                continue
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif hasattr(a, "__dict__") and not isinstance(a, type):  # a dataclass of tensors (a carried sample, say)
        assert type(a) is type(b), where
        _same(vars(a), vars(b), where)
    else:
        assert a == b, (where, a, b)


def _stop_and_resume(model_dir: Path, tmp_path: Path, capsys, steps: int, k: int, extra: tuple[str, ...]
                     ) -> tuple[Path, Path, str, str]:
    """The uninterrupted run and its copy stopped after checkpoint k and resumed; the stderr of each."""
    settings = ["run.save_every=1", f"run.keep_checkpoints={steps}", *extra]
    capsys.readouterr()
    assert main(["train", *_args(model_dir, tmp_path, "full", steps, settings)]) == 0
    full_err = capsys.readouterr().err
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", cut)
    for ck in (cut / "checkpoints").glob("step_*"):
        if int(ck.name.removeprefix("step_")) > k:
            shutil.rmtree(ck)
    with open(cut / "metrics.jsonl", "a") as f:  # killed while writing a line
        f.write(f'{{"step": {steps + 1}, "rollout/rew')
    assert main(["train", "--resume", str(cut)]) == 0
    return tmp_path / "full", cut, full_err, capsys.readouterr().err


def _assert_equivalent(full: Path, cut: Path, full_err: str, cut_err: str, steps: int, k: int) -> None:
    assert _untimed(_rows(cut)) == _untimed(_rows(full))
    assert [r["step"] for r in _rows(cut) if "time/setup_s" in r] == [0, k]  # the start's row and the resume's
    assert _step_notes(cut_err, k) == _step_notes(full_err, k)  # the planner's notes, said once a run
    last = latest_checkpoint(full).name  # step_{steps}, or the step that stopped the run early
    assert latest_checkpoint(cut).name == last and checkpoint_step(latest_checkpoint(full)) <= steps
    a, b = (load_file(str(d / "checkpoints" / last / "weights.safetensors")) for d in (full, cut))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    sa, sb = (torch.load(d / "checkpoints" / last / "state.pt", weights_only=False) for d in (full, cut))
    _same(sa, sb, "state")


CASES = {
    # every preset planner, on a pool small enough that its belief about a prompt decides the prompt's next visit
    "uniform": (3, 1, ("planner.strategy=uniform", *SMALL_POOL)),
    "dapo": (3, 1, ("planner.strategy=dapo", *SMALL_POOL)),
    "greso": (4, 2, ("planner.strategy=greso", *SMALL_POOL)),
    "mopps": (3, 1, ("planner.strategy=mopps", *SMALL_POOL)),
    "vade": (3, 1, ("planner.strategy=vade", *SMALL_POOL)),
    "knapsack": (3, 1, ("planner.strategy=knapsack", *SMALL_POOL)),
    "dars": (3, 1, ("planner.strategy=dars", *SMALL_POOL)),
    "ar3po": (3, 1, ("planner.strategy=ar3po", *SMALL_POOL)),
    "e3": (3, 1, ("planner.strategy=e3", *SMALL_POOL)),
    "adaptive": (4, 2, SMALL_POOL),
    "adaptive_next_step": (3, 1, ("planner.screen_followup=next_step", *SMALL_POOL)),
    # a rollout budget below one group: the planner's note is said once a run, not again by the resume
    "small_budget_rollouts": (3, 1, ("planner.strategy=uniform", "planner.budget_rollouts=2", *SMALL_POOL)),
    # a token budget below one group: said once the first lengths are known (step 2), not again after a resume at 2
    "small_budget_tokens": (3, 2, ("planner.strategy=uniform", "planner.budget_tokens=8", *SMALL_POOL)),
    # partial rollouts and speculative reuse: carried groups, banked responses and the engine's state come back
    "partial_spec": (4, 2, ("rollout.partial_rollouts=true", "rollout.speculative_reuse=true", "rollout.num_slots=4",
                            "rollout.max_completion_length=12", "algo.offpolicy_correction=tis", *SMALL_POOL)),
    # a token budget carried between steps, with partial rollouts' dropped tokens charged to it
    "budget_tokens_partial": (4, 2, ("planner.budget_tokens=100", "rollout.partial_rollouts=true",
                                     "rollout.partial_stop_fraction=0.25", "rollout.max_completion_length=24",
                                     "rollout.retention_limit=1", *SMALL_POOL)),
    "overlap_rounds": (4, 2, ("rollout.overlap_rounds=true", "rollout.max_completion_length=16", *SMALL_POOL)),
    # the schedule, several passes, LoRA's dropout (torch's RNG) and the KL term
    "schedule_passes": (4, 2, ("train.lr_scheduler=cosine", "train.warmup_steps=1", "algo.num_iterations=2",
                               *SMALL_POOL)),
    "lora": (3, 1, ("model.lora.enabled=true", "model.lora.r=4", "model.lora.dropout=0.1", "algo.beta=0.1",
                    *SMALL_POOL)),
    # evaluations between the checkpoints and at both ends, the best weights, early stopping (which stops this one)
    "evals": (4, 2, ("eval.every_n_steps=2", "eval.at_start=true", "eval.at_end=true", "eval.save_best=true",
                     "eval.early_stopping_patience=5", *SMALL_POOL)),
    "early_stop": (5, 1, ("eval.every_n_steps=1", "eval.at_start=true", "eval.at_end=true",
                          "eval.early_stopping_patience=2", "eval.early_stopping_min_delta=0.5", *SMALL_POOL)),
    # the asynchronous loop (a checkpoint every step makes its producer wait each step: no timing in the result)
    "async": (3, 1, ("distributed.async_training=true", "distributed.max_staleness=1", *SMALL_POOL)),
}
WITH_EVALS = ("evals", "early_stop")


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_stopped_after_a_checkpoint_and_resumed_is_the_run_not_stopped(tiny_model_dir, tmp_path, capsys, case):
    steps, k, extra = CASES[case]
    extra = extra if case in WITH_EVALS else (*QUIET, *extra)
    full, cut, full_err, cut_err = _stop_and_resume(tiny_model_dir, tmp_path, capsys, steps, k, extra)
    _assert_equivalent(full, cut, full_err, cut_err, steps, k)
    if case == "early_stop":  # stopped by the patience after the resume, where the uninterrupted run stopped
        assert k < checkpoint_step(latest_checkpoint(full)) < steps
    if case.startswith("small_budget"):
        assert sum("below one group" in n for n in _step_notes(full_err, 0)) == 1, full_err
        assert "below one group" not in cut_err, cut_err


@pytest.mark.parametrize("budget", [{"budget_rollouts": 2}, {"budget_tokens": 8}])
def test_the_small_budget_note_is_kept_in_the_planner_state(budget):
    """The once-a-run note that the budget is below one group: a planner restored from a checkpoint taken after it
    was said does not say it again (it was not in the planner's state, so every resume said it again)."""
    from rollwise.config import PlannerConfig
    from rollwise.planner import GroupResult, build_planner

    uids = [f"q{i}" for i in range(8)]

    def make():
        return build_planner(PlannerConfig(strategy="uniform", **budget), uids, 4, 4, 16, 0)

    a = make()
    notes = []
    for s in range(2):
        reqs = a.begin_step(s)
        a.observe([GroupResult(q.uid, [float(i % 2) for i in range(q.n)], [8] * q.n) for q in reqs])
        notes += a.end_step().notes
    assert sum("below one group" in n for n in notes) == 1, notes
    b = make()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    b.begin_step(2)
    assert not any("below one group" in n for n in b.end_step().notes)
    if "budget_rollouts" in budget:  # a checkpoint from before the note was said: said after the resume
        b = make()
        b.load_state_dict(json.loads(json.dumps(make().state_dict())))
        b.begin_step(0)
        assert any("below one group" in n for n in b.end_step().notes)


def test_setup_time_includes_the_engine_weight_load(tiny_model_dir, tmp_path, monkeypatch):
    """time/setup_s covers the whole start, up to the first step: the engine's first weight load included (it was
    written before `train()` loaded the policy's weights into the engine, which with vLLM takes seconds)."""
    from rollwise.engine import HFEngine

    load, run_dir, seen = HFEngine.load_weights, tmp_path / "s", []

    def slow_first_load(self, state_dict, version):
        if not getattr(self, "_loaded_once", False):  # the engine's first load, of the start's weights
            self._loaded_once = True
            seen.append(sum("time/setup_s" in r for r in _rows(run_dir)) if (run_dir / "metrics.jsonl").is_file()
                        else 0)  # the setup rows written by then
            time.sleep(0.5)
        return load(self, state_dict, version)

    monkeypatch.setattr(HFEngine, "load_weights", slow_first_load)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "s", 1, QUIET)]) == 0
    assert main(["train", "--resume", str(run_dir), "train.max_steps=2"]) == 0
    assert seen == [0, 1]  # each start's row not yet written when its engine loads its weights
    setup = [r for r in _rows(run_dir) if "time/setup_s" in r]
    assert [r["step"] for r in setup] == [0, 1] and all(r["time/setup_s"] >= 0.5 for r in setup), setup
