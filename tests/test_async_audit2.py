"""A second audit of the asynchronous loop (distributed/async_loop.py) against the synchronous one: evaluations
during training, the best weights, early stopping, the rollout-token budget, eta = 0 and Ctrl-C."""

import io
import json
import threading

import pytest
from safetensors.torch import load_file
from test_async import _comparable
from test_e2e import _args

import rollwise.loop as loop
from rollwise.cli import main
from rollwise.distributed import async_loop


def _asy(eta):
    return ["distributed.async_training=true", f"distributed.max_staleness={eta}"]


def _evals(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows if "eval/accuracy" in r]


def _last(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if "rollout/reward_mean" in x]
    return rows[-1]


def _checkpoints(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def _best(run_dir):
    return json.loads((run_dir / "checkpoints" / "best" / "best.json").read_text())["step"]


def _scripted(monkeypatch, accuracy, seen=None):
    """evaluate() scores the evaluation engine's weights version `v` as accuracy[v], and records the weights."""

    def fake(engine, items, *a, **k):
        if seen is not None:
            seen.append((engine.version, {k: v.detach().clone() for k, v in engine.model.state_dict().items()}))
        return {"eval/accuracy": accuracy[engine.version], "eval/items": float(len(items))}

    monkeypatch.setattr(loop, "evaluate", fake)


@pytest.mark.parametrize("strategy", ["dapo", "adaptive"])
def test_eta_zero_equals_the_synchronous_loop_with_evaluations_on(tiny_model_dir, tmp_path, strategy):
    base = ["eval.at_start=true", "eval.at_end=true", "eval.every_n_steps=1", "eval.save_best=true", "eval.pass_k=2",
            "distributed.weight_sync_tokens=8", f"planner.strategy={strategy}", "rollout.overlap_rounds=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "sync", 4, base)]) == 0
    assert main(["train", *_args(tiny_model_dir, tmp_path, "async0", 4, [*base, *_asy(0)])]) == 0
    assert _comparable(tmp_path / "sync") == _comparable(tmp_path / "async0")
    assert _evals(tmp_path / "sync") == _evals(tmp_path / "async0")
    assert _best(tmp_path / "sync") == _best(tmp_path / "async0")


@pytest.mark.parametrize("eta", [0, 2])
def test_early_stop_at_the_synchronous_loops_step_with_nothing_produced_ahead(tiny_model_dir, tmp_path, monkeypatch,
                                                                              eta):
    accuracy = dict(enumerate([0.0, 0.5, 0.6, 0.4, 0.3, 0.2, 0.1, 0.1]))  # stops after step 4, best at step 2
    base = ["eval.at_start=false", "eval.at_end=true", "eval.every_n_steps=1", "eval.save_best=true",
            "eval.early_stopping_patience=2", "run.save_every=0", "rollout.overlap_rounds=false"]
    seen_sync, seen_async = [], []
    _scripted(monkeypatch, accuracy, seen_sync)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "sync", 7, base)]) == 0
    _scripted(monkeypatch, accuracy, seen_async)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "asy", 7, [*base, *_asy(eta)])]) == 0
    s, a = _last(tmp_path / "sync"), _last(tmp_path / "asy")
    assert s["step"] == a["step"] == 4
    assert [v for v, _ in seen_async] == [v for v, _ in seen_sync] == [1, 2, 3, 4]
    # the producer waits at each evaluation: no batch past step 4 was made, and the weights are the synchronous ones
    for key in ("rollout/rollouts_total", "rollout/tokens_total"):
        assert s[key] == a[key]
    assert all(all((w[k] == v[k]).all() for k in w) for (_, w), (_, v) in zip(seen_sync, seen_async))
    assert _best(tmp_path / "sync") == _best(tmp_path / "asy") == 2
    assert _checkpoints(tmp_path / "asy") == ["best", "step_000004"]


def test_evaluations_and_the_best_weights_are_those_of_their_step_while_the_producer_runs_ahead(
        tiny_model_dir, tmp_path, monkeypatch):
    seen = []
    _scripted(monkeypatch, {2: 0.1, 4: 0.5, 6: 0.2}, seen)
    extra = ["eval.at_start=false", "eval.at_end=true", "eval.every_n_steps=2", "eval.save_best=true",
             "run.save_every=2", "run.keep_checkpoints=10", *_asy(2)]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "e2", 6, extra)]) == 0
    ck = tmp_path / "e2" / "checkpoints"
    assert [v for v, _ in seen] == [2, 4, 6]
    for (_, w), step in zip(seen, (2, 4, 6)):
        saved = load_file(str(ck / f"step_00000{step}" / "weights.safetensors"))
        assert all((w[k] == t).all() for k, t in saved.items())
    best, four = load_file(str(ck / "best" / "weights.safetensors")), load_file(str(ck / "step_000004" / "weights.safetensors"))
    assert _best(tmp_path / "e2") == 4 and all((best[k] == four[k]).all() for k in four)


def test_a_token_budget_stops_at_the_synchronous_loops_step_and_resumes_finished(tiny_model_dir, tmp_path, capsys):
    base = ["eval.at_start=false", "eval.at_end=false", "train.max_rollout_tokens=300", "run.save_every=0",
            "rollout.overlap_rounds=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "sync", 8, base)]) == 0
    assert main(["train", *_args(tiny_model_dir, tmp_path, "asy", 8, [*base, *_asy(1)])]) == 0
    s, a = _last(tmp_path / "sync"), _last(tmp_path / "asy")
    assert s["step"] == a["step"] < 8 and s["rollout/tokens_total"] == a["rollout/tokens_total"] >= 300
    assert _checkpoints(tmp_path / "asy") == [f"step_{a['step']:06d}"]
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "asy")]) == 0
    assert "budget was already spent" in capsys.readouterr().err
    assert _last(tmp_path / "asy")["step"] == a["step"]


def test_an_interrupted_early_stopping_run_stops_where_the_whole_one_did(tiny_model_dir, tmp_path, monkeypatch):
    _scripted(monkeypatch, {0: 0.0, 2: 0.5, 4: 0.6, 6: 0.4, 8: 0.3, 10: 0.2, 12: 0.1})
    base = ["eval.at_start=false", "eval.at_end=true", "eval.every_n_steps=2", "eval.save_best=true",
            "eval.early_stopping_patience=2", "run.save_every=3", *_asy(2)]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "whole", 12, base)]) == 0
    update = async_loop.Learner.update

    def stop_at_8(self, batch, version, *a):
        if version == 8:
            raise KeyboardInterrupt
        return update(self, batch, version, *a)

    monkeypatch.setattr(async_loop.Learner, "update", stop_at_8)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "cut", 12, base)]) == 130
    monkeypatch.setattr(async_loop.Learner, "update", update)
    assert _checkpoints(tmp_path / "cut") == ["best", "step_000003", "step_000006"]
    before = [r for r in _comparable(tmp_path / "cut") if r["step"] <= 6]
    assert main(["train", "--resume", str(tmp_path / "cut")]) == 0
    assert _last(tmp_path / "cut")["step"] == 8
    # at eta = 2 a batch's weights follow timing (which version the store holds when it starts), so the rows
    # differ from the whole run's: each step trained once, those before the checkpoint kept as they were
    rows = _comparable(tmp_path / "cut")
    assert [r["step"] for r in rows] == [r["step"] for r in _comparable(tmp_path / "whole")] == list(range(1, 9))
    assert rows[:6] == before
    assert _checkpoints(tmp_path / "cut") == _checkpoints(tmp_path / "whole") and _best(tmp_path / "cut") == 4


@pytest.mark.parametrize("eta", [0, 1])
@pytest.mark.parametrize("where", ["trainer", "producer", "evaluation"])
def test_ctrl_c_leaves_a_checkpoint_that_resumes_to_the_whole_run(tiny_model_dir, tmp_path, monkeypatch, where, eta):
    """At eta = 0 the resumed run equals the whole one. At eta = 1 a batch is generated under whichever weights
    the store holds when generation starts (the trainer may or may not have published the step before), so two
    runs differ by timing alone: each step is then trained once, none lost, the steps before the checkpoint are
    kept as they were, and evaluations and checkpoints fall at the whole run's steps."""
    base = ["eval.at_start=false", "eval.at_end=true", "eval.every_n_steps=2", "run.save_every=2", *_asy(eta)]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "whole", 5, base)]) == 0
    name, at = {"trainer": ("Learner", 4), "producer": ("produce_batch", 3), "evaluation": ("run_eval", 4)}[where]
    target = getattr(async_loop, name)

    def interrupted(*a, **k):
        if a[1] == at or (where == "trainer" and a[2] == at):
            raise KeyboardInterrupt
        return original(*a, **k)

    if where == "trainer":
        original = target.update
        monkeypatch.setattr(target, "update", interrupted)
    else:
        original = target
        monkeypatch.setattr(async_loop, name, interrupted)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "cut", 5, base)]) == 130
    monkeypatch.undo()
    assert _checkpoints(tmp_path / "cut") == ["step_000002"]
    before = [r for r in _comparable(tmp_path / "cut") if r["step"] <= 2]
    assert main(["train", "--resume", str(tmp_path / "cut")]) == 0
    if eta == 0:
        assert _comparable(tmp_path / "cut") == _comparable(tmp_path / "whole")
        assert _evals(tmp_path / "cut") == _evals(tmp_path / "whole")
    else:
        rows = _comparable(tmp_path / "cut")
        assert [r["step"] for r in rows] == [r["step"] for r in _comparable(tmp_path / "whole")] == [1, 2, 3, 4, 5]
        assert rows[:2] == before
        assert [r["step"] for r in _evals(tmp_path / "cut")] == [r["step"] for r in _evals(tmp_path / "whole")]
    assert _checkpoints(tmp_path / "cut") == _checkpoints(tmp_path / "whole")


@pytest.mark.parametrize("which", ["sync", "async"])
def test_ctrl_c_leaves_no_thread_or_reward_worker_running(tiny_model_dir, tmp_path, monkeypatch, which):
    """Ctrl-C (a KeyboardInterrupt in the trainer) in library use, where the caller goes on (a notebook): the
    progress bar's refresh thread, TensorBoard's writer thread and the reward worker stop, and the terminal gets
    its cursor back. Both loops left TensorBoard's thread and the reward worker running; the synchronous one also
    left the bar refreshing, with the cursor hidden."""
    from rich.console import Console

    from rollwise import ui
    from rollwise.rewards.runner import RewardRunner
    from rollwise.training.policy import PolicyTrainer

    screen = io.StringIO()
    monkeypatch.setattr(ui, "console", Console(file=screen, force_terminal=True, width=100))
    update, start, calls, runners = PolicyTrainer.update, RewardRunner.start, [], []

    def third_update_interrupted(self, *a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return update(self, *a, **k)

    def recorded(self):
        runners.append(self)
        return start(self)

    monkeypatch.setattr(PolicyTrainer, "update", third_update_interrupted)
    monkeypatch.setattr(RewardRunner, "start", recorded)
    extra = ["eval.at_start=false", "eval.at_end=true", "run.progress=true", "run.tensorboard=true",
             *(_asy(1) if which == "async" else [])]
    before = set(threading.enumerate())
    assert main(["train", *_args(tiny_model_dir, tmp_path, "cut", 4, extra)]) == 130
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []
    assert runners and all(r._proc is None for r in runners)  # the reward worker was stopped
    assert screen.getvalue().rsplit("\x1b[?25l", 1)[-1].count("\x1b[?25h")  # shown again after it was last hidden
    monkeypatch.undo()
    assert main(["train", "--resume", str(tmp_path / "cut")]) == 0  # from the checkpoint at step 2
