"""Audit of `rollwise eval`, `export`, `report` (one run and several) and the metrics files: each test failed
before its fix. Tiny models and hand-built run folders only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rollwise.cli import main

DATA = {"tasks": [{"name": "chain_sum", "params": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}],
        "train_size": 40, "eval_size": 8}


def _fake_run(tmp_path: Path, model_dir: Path, name: str = "run", **sections) -> Path:
    """A run folder as `rollwise train` leaves it, without training: its config.yaml and one checkpoint holding the
    tiny model's own weights."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from rollwise.config import build_config, config_to_dict

    raw = {"model": {"name_or_path": str(model_dir), "dtype": "float32"}, "data": DATA,
           "reward": {"functions": [{"name": "exact_match"}]},
           "rollout": {"max_completion_length": 2}, "run": {"torch_threads": 1, "progress": False}}
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v}
    run = tmp_path / name
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(build_config(raw))))
    sd = AutoModelForCausalLM.from_pretrained(str(model_dir)).state_dict()
    save_file({k: v.clone().contiguous() for k, v in sd.items() if k != "lm_head.weight"},
              str(run / "checkpoints" / "step_000002" / "weights.safetensors"))
    return run


def _eval_rows(out: str) -> dict[str, str]:
    rows = {}
    for ln in out.splitlines():
        parts = [p.strip() for p in ln.strip("│┃ ").split("│")]
        if len(parts) == 2 and parts[0].startswith("eval/"):
            rows[parts[0]] = parts[1]
    return rows


# ---------------------------------------------------------------- rollwise eval: held-out items the run trained on


def test_eval_of_a_run_with_more_held_out_items_leaves_out_the_questions_it_trained_on(tiny_model_dir, tmp_path,
                                                                                       capsys):
    """`rollwise eval RUN data.eval_size=30` (or another run.seed) draws held-out items that the run's training set
    did not avoid: 5 of those 30 were questions the run trained on, scored as held out."""
    from rollwise.config import build_config
    from rollwise.data import build_items

    run = _fake_run(tmp_path, tiny_model_dir)
    train, _ = build_items(build_config({"data": DATA}).data, 0)
    asked = {it.question for it in train}
    for override, seed, size in (("data.eval_size=30", 0, 30), ("run.seed=1", 1, 8)):
        _, held = build_items(build_config({"data": {**DATA, "eval_size": size}}).data, seed)
        overlap = sum(it.question in asked for it in held)
        assert overlap > 0  # the case this test is about
        assert main(["eval", str(run), override]) == 0
        captured = capsys.readouterr()
        assert _eval_rows(captured.out)["eval/items"] == str(size - overlap), captured.out
        assert f"{overlap} of the {size} held-out items ask a question the run trained on" in captured.err
    # the run's own held-out items: nothing to leave out, nothing said
    assert main(["eval", str(run)]) == 0
    captured = capsys.readouterr()
    assert _eval_rows(captured.out)["eval/items"] == "8" and "trained on" not in captured.err


# ---------------------------------------------------------------- rollwise eval: a CONFIG.yaml naming another model


def test_eval_of_a_run_refuses_another_model_given_in_a_config_file(tiny_model_dir, tmp_path, monkeypatch):
    """The check that the checkpoint's weights meet the run's own model read the overrides only: a CONFIG.yaml
    naming another base model (or other LoRA settings) was merged first and compared with itself, so eval loaded
    the checkpoint into that model without a word. A relative path to the run's own model is the same model."""
    from rollwise.config import ConfigError
    from rollwise.evalcmd import _target_config

    run = _fake_run(tmp_path, tiny_model_dir)
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"model": {"name_or_path": str(tmp_path / "elsewhere")}, "eval": {"pass_k": 2}}))
    with pytest.raises(ConfigError, match="model.name_or_path cannot differ from the run's"):
        _target_config(str(run), [str(other)])
    lora = tmp_path / "lora.yaml"
    lora.write_text(yaml.safe_dump({"model": {"lora": {"enabled": True}}}))
    with pytest.raises(ConfigError, match="model.lora.enabled cannot differ from the run's"):
        _target_config(str(run), [str(lora)])
    # the same model named by a relative path (a training config written beside the model) is no other model
    monkeypatch.chdir(tiny_model_dir.parent)
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump({"model": {"name_or_path": f"./{tiny_model_dir.name}"}, "eval": {"pass_k": 2}}))
    cfg, ckpt = _target_config(str(run), [str(same)])
    assert cfg.eval.pass_k == 2 and ckpt is not None
    _target_config(str(run), [f"model.name_or_path=./{tiny_model_dir.name}"])  # as an override too


# ---------------------------------------------------------------- eval/accuracy/<task>: one line per entry of data.tasks


def test_per_task_accuracy_keeps_two_entries_of_one_generator_apart():
    """data.tasks may list one generator twice (chain_sum at 1 and at 2 digits: the second is labelled chain_sum#2,
    as planner/task_share/chain_sum#2 and the items' uids say): eval/accuracy/chain_sum pooled both entries, so
    the easy and the hard one could not be told apart."""
    from types import SimpleNamespace

    from rollwise.config import build_config
    from rollwise.data import build_items
    from rollwise.engine.hf import GenerationOutput
    from rollwise.evaluate import evaluate

    tasks = [{"name": "chain_sum", "params": {"min_terms": 2, "max_terms": 2, "max_digits": 1}},
             {"name": "chain_sum", "params": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2}}]
    _, items = build_items(build_config({"data": {"tasks": tasks, "train_size": 8, "eval_size": 8}}).data, 0)
    assert {it.uid.split(":")[0] for it in items} == {"chain_sum", "chain_sum#2"}

    class Engine:  # answers the easy entry's items right, the hard one's wrong
        def generate(self, reqs, generator=None):
            return [GenerationOutput([i], [0.0], [0], "stop") for i in range(len(reqs))]

    class Runner:
        def score(self, texts, its):
            parts = [{"m": float(not it.uid.startswith("chain_sum#2"))} for it in its]
            return SimpleNamespace(parts=parts, rewards=[p["m"] for p in parts], errors=0, timeouts=0, nans=0)

    tok = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: str(ids))
    m = evaluate(Engine(), items, [[1]] * len(items), Runner(), "m", tok, max_new_tokens=2)
    assert m["eval/accuracy/chain_sum"] == 1.0 and m["eval/accuracy/chain_sum#2"] == 0.0, m
    assert m["eval/accuracy"] == 0.5


# ---------------------------------------------------------------- rollwise report RUN_A RUN_B: pairing by seed


def _run_folder(path: Path, strategy: str, seed: int, tokens_per_step: float, accs: dict[int, float],
                steps: int = 4) -> Path:
    """A run folder of `steps` steps with evaluations {step: accuracy}."""
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump({"run": {"name": path.name, "seed": seed},
                                                      "planner": {"strategy": strategy}, "train": {"max_steps": 4}}))
    rows = [{"step": 0, "time/setup_s": 1.0}]
    for step in range(steps + 1):
        if step:
            rows.append({"step": step, "rollout/reward_mean": 0.5, "rollout/tokens_total": step * tokens_per_step})
        if step in accs:
            rows.append({"step": step, "eval/accuracy": accs[step]})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_run_with_no_evaluation_after_training_is_not_paired_with_its_start_as_its_final_accuracy(tmp_path):
    """A run killed before its final evaluation (or with eval.at_end=false) has only the evaluation before
    training: the pairing by seed took that starting accuracy as the run's final one, and its half-spent tokens
    as its cost, and reported a difference in final accuracy that no run measured."""
    from rollwise.compare import paired_by_seed

    runs = [_run_folder(tmp_path / "u0", "uniform", 0, 100, {0: 0.2, 4: 0.40}),
            _run_folder(tmp_path / "a0", "adaptive", 0, 80, {0: 0.2, 4: 0.42}),
            _run_folder(tmp_path / "u1", "uniform", 1, 100, {0: 0.2, 4: 0.30}),
            _run_folder(tmp_path / "a1", "adaptive", 1, 60, {0: 0.2, 4: 0.26}),
            _run_folder(tmp_path / "u2", "uniform", 2, 100, {0: 0.2, 4: 0.50}),
            _run_folder(tmp_path / "a2", "adaptive", 2, 50, {0: 0.2}, steps=2)]  # killed at step 2, before its end
    lines = paired_by_seed(runs)
    # seeds 0 and 1 only: +2 and -4 points, mean -1.0, SE 3.0; tokens 0.80 and 0.60 (seed 2 read as -30 points)
    assert lines[1] == ("  planner.strategy=adaptive: -1.0 points (SE 3.0), ahead on 1 of 2 seeds; 0.70 of the tokens "
                        "(0.60-0.80)"), lines
    assert any(str(runs[5]) in ln and "no evaluation after training" in ln for ln in lines), lines


# ---------------------------------------------------------------- TensorBoard: a resume or a start again with it off


def test_a_resume_with_tensorboard_off_still_drops_the_replaced_steps_events(tmp_path):
    """`--resume RUN run.tensorboard=false` (or a start again with it off) cut metrics.jsonl back to the checkpoint
    but left the event files of the replaced steps: `tensorboard --logdir runs` kept showing steps 3-5 of the
    killed attempt beside metrics.jsonl's."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    from rollwise.tracking import Tracker

    def steps() -> set[int]:
        out = set()
        for p in (tmp_path / "tensorboard").iterdir():
            for raw in RawEventFileLoader(str(p)).Load():
                ev = Event.FromString(raw)
                out |= {ev.step for v in ev.summary.value}
        return out

    t = Tracker(tmp_path, truncate_after_step=-1)
    for step in range(1, 6):
        t.log(step, {"rollout/reward_mean": 0.1 * step})
    t.close()
    assert steps() == {1, 2, 3, 4, 5}
    Tracker(tmp_path, tensorboard=False, truncate_after_step=2).close()  # resumed from step 2's checkpoint
    assert steps() == {1, 2}
    Tracker(tmp_path, tensorboard=False, truncate_after_step=-1).close()  # started again: nothing of before
    assert steps() == set()


# ---------------------------------------------------------------- rollwise eval RUN: no step checkpoint, a best one


def test_eval_of_a_run_with_no_step_checkpoint_points_to_its_saved_best(tmp_path):
    """A run stopped before its first step checkpoint may have saved its best weights (eval.save_best): export's
    message names that folder, eval's said only to rerun the run or evaluate the base model."""
    from rollwise.evalcmd import no_checkpoint_message

    best = tmp_path / "checkpoints" / "best"
    best.mkdir(parents=True)
    (best / "weights.safetensors").write_bytes(b"")
    assert f"`rollwise eval {best}`" in no_checkpoint_message(tmp_path, "eval")
    assert "best" not in no_checkpoint_message(tmp_path / "other", "eval")


# ---------------------------------------------------------------- the summary of a run resumed elsewhere


def test_the_summary_says_where_a_resume_computed_on_another_machine_or_dtype(tmp_path, capsys):
    """`computed on` names the start's machine, dtype and threads only: a run resumed on another machine or in
    another dtype showed the first machine's for every step."""
    from rollwise.environment import describe_environment
    from rollwise.ui import print_summary

    _run_folder(tmp_path / "r", "uniform", 0, 100, {0: 0.2, 4: 0.4})
    env = describe_environment()
    start = {**env, "compute_dtype": "float32", "resumed_from_step": None}
    later = {**env, "compute_dtype": "bfloat16", "resumed_from_step": 2}
    (tmp_path / "r" / "environment.json").write_text(json.dumps([start, later]))
    summary = print_summary(tmp_path / "r")
    changed = summary.get("environment changed at a resume", "")
    assert "compute_dtype: bfloat16 (resumed at step 2); float32 (start)" in changed, summary
    (tmp_path / "r" / "environment.json").write_text(json.dumps([start, {**start, "resumed_from_step": 2}]))
    assert "environment changed at a resume" not in print_summary(tmp_path / "r")


# ---------------------------------------------------------------- plain progress lines (stderr to a file)


def test_a_run_stopped_before_max_steps_writes_its_last_step_to_a_log_file(monkeypatch, capsys):
    """Where stderr is a file, a plain line is written every 30 s and at the last step: a run that stopped before
    train.max_steps (its token budget, early stopping) never reached `step >= total`, so the log's last progress
    line was up to 30 s old, and a short run wrote none at all."""
    from rich.console import Console

    import rollwise.ui as ui

    monkeypatch.setattr(ui, "console", Console(stderr=True, force_terminal=False))
    clock = iter([0.0, 5.0, 10.0, 12.0])
    monkeypatch.setattr(ui.StepProgress, "clock", staticmethod(lambda: next(clock)))
    bar = ui.StepProgress(total=40, start=0)
    for step in (1, 2):  # the token budget stops the run after step 2 of 40
        bar.update(step, {"rollout/reward_mean": 0.25})
    bar.close()
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("rollwise: step")]
    assert [ln.split("  ")[0] for ln in lines] == ["rollwise: step 2/40"], lines
    assert "reward 0.250" in lines[0] and lines[0].endswith("12 s, stopped"), lines


def test_eval_counts_the_reward_calls_that_failed():
    """A reward function that raised on every call gave `rollwise eval` an accuracy of 0 and nothing else: the
    warning pointed to reward/errors, a training metric eval does not show."""
    from types import SimpleNamespace

    from rollwise.config import RewardConfig
    from rollwise.engine.hf import GenerationOutput
    from rollwise.evaluate import evaluate
    from rollwise.rewards import RewardRunner
    from rollwise.types import PromptItem

    class Engine:
        def generate(self, reqs, generator=None):
            return [GenerationOutput([5], [0.0], [0], "stop") for _ in reqs]

    items = [PromptItem(uid=f"t:eval:{i}", task="t", question="q", answer="1") for i in range(3)]
    tok = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: "ok")
    cfg = RewardConfig(functions=[{"name": "rewards_for_tests:raises_unless_ok"}, {"name": "exact_match"}], timeout=30)
    with RewardRunner(cfg) as runner:
        m = evaluate(Engine(), items, [[1]] * 3, runner, "raises_unless_ok", tok, max_new_tokens=2, pass_k=2)
    assert m["eval/reward_failures"] == 0.0
    cfg = RewardConfig(functions=[{"name": "rewards_for_tests:always_raises"}], timeout=30)
    with RewardRunner(cfg) as runner:
        m = evaluate(Engine(), items, [[1]] * 3, runner, "always_raises", tok, max_new_tokens=2, pass_k=2)
    assert m["eval/accuracy"] == 0.0 and m["eval/reward_failures"] == 3.0 + 6.0, m
