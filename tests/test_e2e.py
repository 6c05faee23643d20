"""The whole loop on a tiny model through the real `rollwise` entry point."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rollwise.cli import main

TESTS = Path(__file__).parent


def _args(model_dir, out, name, steps, extra=()):
    return [
        f"model.name_or_path={model_dir}", "model.dtype=float32",
        "data.tasks=[{name: chain_sum, params: {min_terms: 2, max_terms: 2, max_digits: 1}}]",
        "data.train_size=40", "data.eval_size=8",
        "reward.functions=[{name: 'rewards_for_tests:digit_share'}]",
        "rollout.prompts_per_step=4", "rollout.num_generations=4", "rollout.max_completion_length=8",
        "rollout.batch_size=8", "train.learning_rate=0.003", "train.warmup_steps=0", "train.micro_batch_size=8",
        f"train.max_steps={steps}", "run.save_every=2", "run.torch_threads=1", "run.progress=false",
        f"run.output_dir={out}", f"run.name={name}", *extra,
    ]


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def _train_lines(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "rollout/tokens_per_s"))}
            for r in rows if "rollout/reward_mean" in r]


def test_train_writes_run_folder_and_learns(tiny_model_dir, tmp_path, capsys):
    assert main(["train", *_args(tiny_model_dir, tmp_path, "learn", 8, ["eval.pass_k=2"])]) == 0
    run = tmp_path / "learn"
    assert (run / "config.yaml").is_file()
    assert list((run / "tensorboard").glob("events.*"))
    assert (run / "checkpoints" / "step_000008" / "weights.safetensors").is_file()
    assert len(list((run / "checkpoints").glob("step_*"))) == 2  # keep_checkpoints
    lines = _train_lines(run)
    assert [r["step"] for r in lines] == list(range(1, 9))
    # every group rolled out is logged (uid, outcomes in generation order) for `rollwise simulate --fit`
    assert all(sum(len(g[1]) for g in r["rollout/groups"]) == r["rollout/rollouts"] for r in lines)
    assert all(set(g[1]) <= {"0", "1"} and g[0].startswith("chain_sum:train:") for r in lines for g in r["rollout/groups"])
    assert all(len(g[2]) == len(g[1]) and all(isinstance(n, int) and n >= 0 for n in g[2])
               for r in lines for g in r["rollout/groups"])  # response lengths, in the order of the outcomes
    rewards = [r["rollout/reward_mean"] for r in lines]
    assert sum(rewards[4:]) > sum(rewards[:4]), rewards  # sampled rewards drift up (noisy at 16 samples a step)
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "eval/accuracy" in x]
    assert [e["step"] for e in evals] == [0, 8] and "eval/pass@2" in evals[0]
    # the policy really moved toward the reward: greedy held-out accuracy (deterministic given the weights)
    assert evals[1]["eval/accuracy"] >= evals[0]["eval/accuracy"] + 0.5, evals
    out = capsys.readouterr().out
    assert "held-out accuracy" in out
    assert "planner" in out and "adaptive" in out and "effective ratio (mean)" in out  # the default planner, named
    assert "stopped by" in out and "train.max_steps=8" in out
    assert main(["report", str(run)]) == 0
    assert (run / "report.png").stat().st_size > 1000
    capsys.readouterr()
    assert main(["eval", str(run), "run.progress=false"]) == 0
    # it reproduces the run's own final evaluation (the same engine dtype and weights)
    row = next(ln for ln in capsys.readouterr().out.splitlines() if "eval/accuracy " in ln)
    assert f"{evals[1]['eval/accuracy']:.4f}" in row, row
    assert main(["eval", str(run), "data.max_prompt_length=2"]) == 2  # every held-out prompt too long: said
    assert "no held-out items to evaluate" in capsys.readouterr().err
    # the trained model as a Hugging Face folder: the checkpoint's weights, and the same greedy accuracy
    exported = tmp_path / "exported"
    assert main(["export", str(run), str(exported)]) == 0
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(exported)).state_dict()
    ck = load_file(str(run / "checkpoints" / "step_000008" / "weights.safetensors"))
    assert ck and all((hf[k] == v).all() for k, v in ck.items())
    assert main(["export", str(run), str(exported)]) == 2  # never over an existing folder
    # a disk that fills mid-export (safetensors' own error) is the disk-full message and leaves no half folder
    from transformers import PreTrainedModel

    real_save = PreTrainedModel.save_pretrained

    def full_disk(self, folder, **kw):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space '
                           'left on device" })')

    PreTrainedModel.save_pretrained = full_disk
    (tmp_path / "made").mkdir()  # an OUT_DIR made beforehand, empty: written in place, emptied again on failure
    try:
        assert main(["export", str(run), str(tmp_path / "again")]) == 2
        assert main(["export", str(run), str(tmp_path / "made")]) == 2
    finally:
        PreTrainedModel.save_pretrained = real_save
    assert "disk full" in capsys.readouterr().err
    assert not (tmp_path / "again").exists() and not (tmp_path / ".again.tmp").exists()
    assert (tmp_path / "made").is_dir() and not list((tmp_path / "made").iterdir())
    assert main(["export", str(run), str(tmp_path / "made")]) == 0
    assert main(["export", str(run), str(tmp_path / "again")]) == 0  # the retry is not blocked
    capsys.readouterr()
    assert main(["eval", str(exported), "run.progress=false", "data.tasks=[{name: chain_sum, params: {min_terms: 2, "
                 "max_terms: 2, max_digits: 1}}]", "data.eval_size=8", "reward.functions=[{name: 'rewards_for_tests:digit_share'}]",
                 "rollout.max_completion_length=8", "model.dtype=float32"]) == 0
    assert f"{evals[1]['eval/accuracy']:.4f}" in capsys.readouterr().out
    # a run folder and a CONFIG.yaml: the run's model and checkpoint, the file's settings on top
    extra = tmp_path / "eval.yaml"
    extra.write_text("eval: {pass_k: 3}\n")
    capsys.readouterr()
    assert main(["eval", str(run), str(extra)]) == 0
    out = capsys.readouterr().out
    assert "pass@3" in out and "step_" in out, out


def test_resume_equals_uninterrupted(tiny_model_dir, tmp_path, capsys):
    assert main(["train", *_args(tiny_model_dir, tmp_path, "full", 4, ["eval.at_start=false", "eval.at_end=false"])]) == 0
    assert main(["train", *_args(tiny_model_dir, tmp_path, "half", 2, ["eval.at_start=false", "eval.at_end=false"])]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "half"), "train.max_steps=4"]) == 0
    assert _train_lines(tmp_path / "full") == _train_lines(tmp_path / "half")
    # the run folder says what it was computed on: once at the start, again at the resume
    envs = json.loads((tmp_path / "half" / "environment.json").read_text())
    assert [e["resumed_from_step"] for e in envs] == [None, 2]
    # what the resume changed is said, and kept: config.yaml holds the new settings, the record the old
    assert "rollwise: the resume changes train.max_steps: 2 -> 4" in capsys.readouterr().err
    assert [e.get("config_changes") for e in envs] == [None, {"train.max_steps": [2, 4]}]
    assert yaml.safe_load((tmp_path / "half" / "config.yaml").read_text())["train"]["max_steps"] == 4
    # a resume cannot move the run: the new name would be written into the old folder's config
    assert main(["train", "--resume", str(tmp_path / "half"), "run.name=other"]) == 2
    assert envs[0]["torch_threads"] == 1 and envs[0]["packages"]["torch"]
    a = load_file(str(tmp_path / "full" / "checkpoints" / "step_000004" / "weights.safetensors"))
    b = load_file(str(tmp_path / "half" / "checkpoints" / "step_000004" / "weights.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_a_resume_refuses_changes_its_checkpoint_cannot_carry_and_keeps_the_run(tiny_model_dir, tmp_path, capsys):
    """The training set, seed, model and planner strategy shape the checkpoint's state: a resume that
    changes them stops with a clear error before anything is written, and the run still resumes."""
    assert main(["train", *_args(tiny_model_dir, tmp_path, "fixed", 2, ["eval.at_start=false", "eval.at_end=false"])]) == 0
    saved = (tmp_path / "fixed" / "config.yaml").read_text()
    capsys.readouterr()
    for change in ("data.train_size=30", "run.seed=7", "planner.strategy=uniform", "model.lora.enabled=true"):
        assert main(["train", "--resume", str(tmp_path / "fixed"), "train.max_steps=3", change]) == 2
        err = capsys.readouterr().err
        assert f"--resume cannot change {change.split('=')[0]}" in err and "start a new run" in err, err
        assert (tmp_path / "fixed" / "config.yaml").read_text() == saved
    # a part whose saved state does not fit: a clear error, and config.yaml untouched
    assert main(["train", "--resume", str(tmp_path / "fixed"), "train.max_steps=3", "planner.estimator=window"]) == 2
    err = capsys.readouterr().err
    assert "cannot continue" in err and "planner.estimator" in err, err
    assert (tmp_path / "fixed" / "config.yaml").read_text() == saved
    # a config.yaml written by an older rollwise lacks newer settings: they take their defaults, said on one
    # line and kept apart from what the resume changes
    older = yaml.safe_load(saved)
    del older["planner"]["success_threshold"]
    (tmp_path / "fixed" / "config.yaml").write_text(yaml.safe_dump(older, sort_keys=False))
    assert main(["train", "--resume", str(tmp_path / "fixed"), "train.max_steps=3"]) == 0
    assert len(_train_lines(tmp_path / "fixed")) == 3
    err = capsys.readouterr().err
    assert "1 setting(s) are newer than this run's config.yaml and take their defaults: planner.success_threshold" \
        in err and "the resume changes train.max_steps: 2 -> 3" in err and "None" not in err, err
    last = json.loads((tmp_path / "fixed" / "environment.json").read_text())[-1]
    assert last["config_changes"] == {"train.max_steps": [2, 3]}
    assert last["config_added"] == {"planner.success_threshold": 0.5}


def test_bad_inputs_fail_fast_with_clear_messages(tiny_model_dir, tmp_path, capsys, monkeypatch):
    assert main(["train", "algo.loss_typ=grpo"]) == 2
    assert "Did you mean 'algo.loss_type'" in capsys.readouterr().err
    assert main(["train", f"model.name_or_path={tmp_path}/nope", f"run.output_dir={tmp_path}"]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["train", "reward.functions=[{name: 'no_such_module:f'}]", f"run.output_dir={tmp_path}"]) == 2
    assert "no_such_module" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "missing")]) == 2
    assert "not a rollwise run folder" in capsys.readouterr().err
    # a failed start leaves no empty run folder behind
    out = tmp_path / "runs"
    assert main(["train", "reward.functions=[{name: 'no_such_module:f'}]", f"run.output_dir={out}"]) == 2
    assert not out.exists() or not list(out.iterdir())
    # two config files, and a mistyped relative run folder (not a hub id: its first part is a local folder)
    (tmp_path / "a.yaml").write_text("train: {max_steps: 1}\n")
    (tmp_path / "b.yaml").write_text("train: {max_steps: 2}\n")
    assert main(["train", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")]) == 2
    assert "two config files" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir(exist_ok=True)
    assert main(["eval", "runs/typo-run"]) == 2
    assert "'runs/typo-run' not found" in capsys.readouterr().err


def test_console_entry_point_help():
    out = subprocess.run([sys.executable, "-m", "rollwise", "train", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--resume" in out.stdout
    out = subprocess.run([sys.executable, "-m", "rollwise", "options"], capture_output=True, text=True)
    assert "algo.epsilon_high" in out.stdout


@pytest.mark.parametrize("strategy", ["uniform", "dapo", "greso", "mopps", "vade", "knapsack", "dars", "ar3po", "e3",
                                      "adaptive:screen_growth=eager", "adaptive:screen_followup=next_step"])
def test_every_planner_strategy_trains_and_resumes(tiny_model_dir, tmp_path, strategy):
    # plain adaptive, the default, is in every other test
    name, *overrides = strategy.split(":")
    extra = ["eval.at_start=false", "eval.at_end=false", f"planner.strategy={name}", *(f"planner.{o}" for o in overrides)]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "p", 2, extra)]) == 0
    assert main(["train", "--resume", str(tmp_path / "p"), "train.max_steps=3"]) == 0
    lines = _train_lines(tmp_path / "p")
    assert [r["step"] for r in lines] == [1, 2, 3]
    assert all(r["rollout/rollouts"] > 0 for r in lines)
    assert all("planner/effective_ratio" in r for r in lines)
    # the resumed run is the uninterrupted one: the planner's state (belief, history, draws) came back whole
    assert main(["train", *_args(tiny_model_dir, tmp_path, "whole", 3, extra)]) == 0
    assert _train_lines(tmp_path / "whole") == lines


def test_a_resume_takes_the_belief_from_the_checkpoint_not_prior_counts(tiny_model_dir, tmp_path):
    """The counts file shapes the start only: a resumed run must not need it (it may have moved)."""
    counts = tmp_path / "counts.jsonl"
    counts.write_text("".join(json.dumps({"uid": f"chain_sum:train:{i}", "successes": i % 3, "samples": 2}) + "\n"
                              for i in range(40)))
    extra = ["eval.at_start=false", "eval.at_end=false", f"planner.prior_counts={counts}"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "warm", 2, extra)]) == 0
    counts.unlink()
    assert main(["train", "--resume", str(tmp_path / "warm"), "train.max_steps=3"]) == 0
    assert [r["step"] for r in _train_lines(tmp_path / "warm")] == [1, 2, 3]


def test_lora_with_kl_trains_and_evaluates(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    extra = ["model.lora.enabled=true", "model.lora.r=4", "algo.beta=0.05", "eval.at_start=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "lora", 2, extra)]) == 0
    w = load_file(str(tmp_path / "lora" / "checkpoints" / "step_000002" / "weights.safetensors"))
    assert w and all("lora_" in k for k in w)
    lines = _train_lines(tmp_path / "lora")
    assert all("loss/kl" in r for r in lines)
    # the reference is the base model (adapters off): equal to the policy at step 1, apart once B has moved
    assert lines[0]["loss/kl"] == pytest.approx(0.0, abs=1e-7) and lines[1]["loss/kl"] > 1e-7
    assert main(["eval", str(tmp_path / "lora")]) == 0
    # eval's engine has the run's layout: plain weight names holding the merged adapters (built after LoRA it
    # kept base_layer and lora_ weights apart, and the merged weights never reached them)
    from rollwise.evalcmd import _target_config, eval_engine
    from rollwise.models import load_tokenizer

    cfg, ckpt = _target_config(str(tmp_path / "lora"), [])
    engine = eval_engine(cfg, str(tiny_model_dir), ckpt, load_tokenizer(str(tiny_model_dir)))
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict()
    assert set(engine.model.state_dict()) == set(plain)
    q = next(k for k in plain if "q_proj" in k)
    assert (engine.model.state_dict()[q].float().sum() - plain[q].sum()).abs() > 1e-6  # the adapters reached it
    # the checkpoint's adapters belong to the run's base model and LoRA settings
    assert main(["eval", str(tmp_path / "lora"), "model.lora.alpha=64"]) == 2
    # export merges the adapters: plain base-model parameter names, weights moved away from the base model's
    assert main(["export", str(tmp_path / "lora"), str(tmp_path / "merged"), "--dtype", "bfloat16"]) == 0

    stored = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert {v.dtype for v in stored.values()} == {torch.bfloat16}  # --dtype reached the files
    info = json.loads((tmp_path / "merged" / "rollwise_export.json").read_text())
    assert (info["lora_merged"], info["dtype"], info["base_model"]) == (True, "bfloat16", str(tiny_model_dir))
    assert info["checkpoint"] == str((tmp_path / "lora" / "checkpoints" / "step_000002").resolve())
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged")).state_dict()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict()
    assert merged.keys() == base.keys() and merged["lm_head.weight"].dtype.is_floating_point
    assert any(not (merged[k].float() - base[k]).abs().max() < 1e-2 for k in base if "q_proj" in k)


def test_killed_run_resumes_without_duplicate_or_lost_steps(tiny_model_dir, tmp_path, monkeypatch):
    import rollwise.loop as loop

    quiet = ["eval.at_start=false", "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "ref", 4, quiet)]) == 0
    real_save = loop.save_checkpoint

    def dying_save(run_dir, step, *a, **kw):
        if step == 3:  # killed after step 3 was logged, before its checkpoint landed
            raise KeyboardInterrupt
        return real_save(run_dir, step, *a, **kw)

    monkeypatch.setattr(loop, "save_checkpoint", dying_save)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "killed", 3, quiet)]) == 130
    assert [r["step"] for r in _train_lines(tmp_path / "killed")] == [1, 2, 3]
    monkeypatch.setattr(loop, "save_checkpoint", real_save)
    assert main(["train", "--resume", str(tmp_path / "killed"), "train.max_steps=4"]) == 0
    assert _train_lines(tmp_path / "killed") == _train_lines(tmp_path / "ref")


def test_full_disk_stops_with_a_clear_error_and_the_run_resumes(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The disk fills while step 3's metrics are written (half a line lands): exit 2 with what to do;
    after space is freed, --resume restarts from the step-2 checkpoint and logs each step once."""
    import builtins
    import errno

    import rollwise.tracking as tracking

    class FillingFile:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            if text.startswith('{"step": 3') and "rollout/reward_mean" in text:
                self.f.write(text[: len(text) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(text)

    monkeypatch.setattr(tracking, "open", lambda *a, **k: FillingFile(builtins.open(*a, **k)), raising=False)
    quiet = ["eval.at_start=false", "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "full", 4, quiet)]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "free disk space" in err and "--resume" in err
    monkeypatch.delattr(tracking, "open")
    assert main(["train", "--resume", str(tmp_path / "full")]) == 0
    assert [r["step"] for r in _train_lines(tmp_path / "full")] == [1, 2, 3, 4]


@pytest.mark.parametrize("writer", ["save_file", "torch_save"])
def test_disk_full_while_checkpointing_stops_cleanly_and_keeps_the_last_checkpoint(tiny_model_dir, tmp_path,
                                                                                   monkeypatch, capsys, writer):
    """What a full disk raises (measured on a 64 kB tmpfs): safetensors a SafetensorError, torch.save a
    RuntimeError; neither is an OSError. The step-4 checkpoint fails: exit 2 with what to do, no
    half-written folder, step 2's checkpoint intact, and --resume finishes the run."""
    from safetensors import SafetensorError

    import rollwise.training.checkpoint as ck

    real = {"save_file": ck.save_file, "torch_save": ck.torch.save}
    full = {"save_file": SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
            "torch_save": RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")}

    def filling(*a, **k):
        if "step_000004" in str(a[1]):
            raise full[writer]
        return real[writer](*a, **k)

    if writer == "save_file":
        monkeypatch.setattr(ck, "save_file", filling)
    else:
        monkeypatch.setattr(ck.torch, "save", filling)
    quiet = ["eval.at_start=false", "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "full", 4, quiet)]) == 2
    err = capsys.readouterr().err
    assert "could not write the checkpoint" in err and "free disk space" in err and "Traceback" not in err
    # a full disk is said as such, with the command that resumes (a moved run.output_dir would start a new run)
    assert "disk full" in err and f"--resume {tmp_path / 'full'}" in err and "run.output_dir" not in err
    assert sorted(p.name for p in (tmp_path / "full" / "checkpoints").iterdir()) == ["step_000002"]
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(TESTS))
    assert main(["train", "--resume", str(tmp_path / "full")]) == 0
    assert (tmp_path / "full" / "checkpoints" / "step_000004" / "state.pt").is_file()


def test_overlapped_rounds_run_the_planners_follow_ups_in_one_engine_round(tiny_model_dir, tmp_path, capsys):
    base = ["eval.at_start=false", "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "overlap", 3, base)]) == 0  # adaptive, overlap unset: on
    assert main(["train", *_args(tiny_model_dir, tmp_path, "rounds", 3, [*base, "rollout.overlap_rounds=false"])]) == 0
    overlap, rounds = _train_lines(tmp_path / "overlap"), _train_lines(tmp_path / "rounds")
    assert any(r["rollout/rounds"] > 1 for r in overlap + rounds)  # the planner did ask for follow-ups
    assert all(r["rollout/engine_rounds"] == 1 for r in overlap)
    assert all(r["rollout/engine_rounds"] == r["rollout/rounds"] for r in rounds)
    capsys.readouterr()
    assert main(["train", *_args(tiny_model_dir, tmp_path, "dapo", 1, [*base, "planner.strategy=dapo",
                                                                     "rollout.overlap_rounds=true"])]) == 2
    assert "dapo" in capsys.readouterr().err
    assert main(["train", *_args(tiny_model_dir, tmp_path, "hf", 1, [*base, "rollout.engine=hf",
                                                                   "rollout.overlap_rounds=true"])]) == 2
    assert "rollout.engine=hf" in capsys.readouterr().err


def test_partial_rollouts_and_speculative_reuse_train_and_resume(tiny_model_dir, tmp_path, monkeypatch):
    """A small prompt pool revisited every step: resumed prefixes and reused responses both occur,
    and a run stopped half-way and resumed logs exactly what the uninterrupted run logs. A prompt
    whose group is still carried is not requested again while it is."""
    from rollwise.planner.core import ComposedPlanner

    asked = []
    real_begin = ComposedPlanner.begin_step
    monkeypatch.setattr(ComposedPlanner, "begin_step",
                        lambda self, step: asked.append((set(self.in_flight), r := real_begin(self, step))) or r)
    extra = ["rollout.partial_rollouts=true", "rollout.speculative_reuse=true", "rollout.num_slots=4",
             "rollout.max_completion_length=12", "data.train_size=8", "algo.offpolicy_correction=tis",
             "eval.at_start=false", "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "full", 6, extra)]) == 0
    assert any(busy for busy, _ in asked) and not any(busy & {q.uid for q in reqs} for busy, reqs in asked)
    assert main(["train", *_args(tiny_model_dir, tmp_path, "half", 4, extra)]) == 0
    assert main(["train", "--resume", str(tmp_path / "half"), "train.max_steps=6"]) == 0
    full = _train_lines(tmp_path / "full")
    assert full == _train_lines(tmp_path / "half")
    assert sum(r["spec/tokens_reused"] for r in full) > 0
    assert any(r["rollout/buffered"] > 0 for r in full) or any(r["offpolicy/resumed_frac"] > 0 for r in full)


def test_cuda_device_without_cuda_is_a_clear_error(tiny_model_dir, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    assert main(["train", *_args(tiny_model_dir, tmp_path, "cuda", 1, ["model.device=cuda"])]) == 2
    assert "model.device=cuda" in capsys.readouterr().err


def test_out_of_memory_mid_run_resumes_with_a_smaller_micro_batch(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """What the out-of-memory message tells the user to do works: the run stops at step 3 with exit 2,
    and --resume with a lower train.micro_batch_size finishes it from the step-2 checkpoint."""
    import torch

    from rollwise.training.policy import PolicyTrainer

    real = PolicyTrainer.update
    calls = {"n": 0}

    def oom_at_third(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return real(self, *a, **k)

    monkeypatch.setattr(PolicyTrainer, "update", oom_at_third)
    quiet = ["eval.at_start=false", "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "oom", 4, quiet)]) == 2
    assert "out of memory" in capsys.readouterr().err
    monkeypatch.setattr(PolicyTrainer, "update", real)
    assert main(["train", "--resume", str(tmp_path / "oom"), "train.micro_batch_size=2"]) == 0
    assert [r["step"] for r in _train_lines(tmp_path / "oom")] == [1, 2, 3, 4]


def test_truncated_reward_rescores_cut_training_samples_through_the_cli(tiny_model_dir, tmp_path):
    """The tiny model rarely stops within 8 tokens: with reward.truncated_reward every cut sample's
    reward is that value, whatever digit_share gave it; held-out accuracy is scored as written."""
    assert main(["train", *_args(tiny_model_dir, tmp_path, "cut", 1, ["reward.truncated_reward=-0.5"])]) == 0
    row = _train_lines(tmp_path / "cut")[0]
    cut = row["rollout/truncated_frac"]
    assert cut > 0.5, row
    # digit_share is in [0, 1]: the cut share scores -0.5, the rest at most 1
    assert row["rollout/reward_mean"] <= -0.5 * cut + (1 - cut) + 1e-6
    assert main(["train", *_args(tiny_model_dir, tmp_path, "as_written", 1, [])]) == 0
    written = _train_lines(tmp_path / "as_written")[0]
    # same seed, same weights at step 1: the same samples, whose cut ones scored at least 0 as written
    # and -0.5 with the option, so the mean reward differs by at least 0.5 x the cut share
    assert written["rollout/truncated_frac"] == cut
    assert written["rollout/reward_mean"] >= row["rollout/reward_mean"] + 0.5 * cut - 1e-6
    # held-out evaluation scores answers as written: the step-0 evaluations agree
    evals = [next(r for r in map(json.loads, (tmp_path / name / "metrics.jsonl").read_text().splitlines())
                  if "eval/reward_mean" in r) for name in ("cut", "as_written")]
    assert evals[0]["step"] == 0 and evals[0]["eval/reward_mean"] == evals[1]["eval/reward_mean"]
    assert evals[0]["eval/truncated_frac"] > 0  # cut held-out answers exist, and were scored as written


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_token_budget_stops_the_run_and_the_lr_decays_over_it(tiny_model_dir, tmp_path, mode, capsys, monkeypatch):
    """train.max_rollout_tokens ends the run long before train.max_steps; a linear schedule then
    decays over the tokens spent (update k at 1 - tokens before step k / budget), not over max_steps.
    The asynchronous producer starts no batch past the budget: one would change the planner's state
    while the last checkpoint is written."""
    import rollwise.distributed.async_loop as async_loop

    produced = []
    real = async_loop.produce_batch
    monkeypatch.setattr(async_loop, "produce_batch", lambda run, k, pool: produced.append(k) or real(run, k, pool))
    extra = ["train.max_rollout_tokens=300", "train.lr_scheduler=linear", "eval.at_start=false"]
    if mode == "async":  # no checkpoint before the last step: the producer runs a batch ahead all along
        extra += ["distributed.async_training=true", "run.save_every=100"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, mode, 40, extra)]) == 0
    lines = _train_lines(tmp_path / mode)
    if mode == "async":
        assert produced == list(range(len(lines)))
    totals = [r["rollout/tokens_total"] for r in lines]
    assert totals[-1] >= 300 > totals[-2] and len(lines) < 40  # stopped by the budget, at the first step over it
    before = [0.0, *totals[:-1]]
    assert [r["train/lr"] for r in lines] == pytest.approx([0.003 * (1 - b / 300) for b in before])
    assert (tmp_path / mode / "checkpoints" / f"step_{len(lines):06d}").is_dir()
    err = capsys.readouterr().err
    assert (f"rollwise: step {len(lines)}: the rollout-token budget is spent ({totals[-1]:,.0f} tokens generated, "
            "train.max_rollout_tokens=300); the run stops before train.max_steps=40") in err
    assert "never decayed" not in err  # the decay ran: no warm-up warning


def test_resuming_a_run_that_spent_its_token_budget_trains_only_with_a_larger_budget(tiny_model_dir, tmp_path, capsys):
    extra = ["train.max_rollout_tokens=150", "eval.at_start=false", "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "spent", 40, extra)]) == 0
    n = len(_train_lines(tmp_path / "spent"))
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "spent")]) == 0  # nothing over the budget
    assert len(_train_lines(tmp_path / "spent")) == n
    assert (f"rollwise: step {n}: the rollout-token budget was already spent") in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "spent"), "train.max_rollout_tokens=300"]) == 0
    lines = _train_lines(tmp_path / "spent")
    assert len(lines) > n and lines[-1]["rollout/tokens_total"] >= 300 > lines[-2]["rollout/tokens_total"]


def test_resuming_a_finished_run_says_so_and_a_max_steps_below_its_checkpoint_is_refused(tiny_model_dir, tmp_path,
                                                                                          capsys):
    extra = ["eval.at_start=false", "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "done", 2, extra)]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "done")]) == 0
    assert len(_train_lines(tmp_path / "done")) == 2
    assert ("rollwise: step 2: the run had already finished its train.max_steps=2; nothing to train"
            in capsys.readouterr().err)
    config = (tmp_path / "done" / "config.yaml").read_text()
    assert main(["train", "--resume", str(tmp_path / "done"), "train.max_steps=1"]) == 2
    assert ("the run's last checkpoint is at step 2, past train.max_steps=1; to train on, give a train.max_steps "
            "above 2") in capsys.readouterr().err
    assert (tmp_path / "done" / "config.yaml").read_text() == config  # refused before anything was rewritten


def test_token_budget_ending_in_warm_up_warns_that_the_schedule_never_decayed(tiny_model_dir, tmp_path, capsys):
    """A token budget that stops the run while the warm-up still lasts: the config check cannot
    see it coming (it knows updates, not tokens), so the run says so when it stops."""
    extra = ["train.max_rollout_tokens=300", "train.lr_scheduler=cosine", "train.warmup_steps=30", "eval.at_start=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "warm_budget", 40, extra)]) == 0
    n = len(_train_lines(tmp_path / "warm_budget"))
    assert n < 30
    err = capsys.readouterr().err
    assert (f"rollwise: warning: the rollout-token budget (train.max_rollout_tokens=300) ended the run after {n} "
            f"optimizer updates, within the warm-up of train.warmup_steps=30: train.lr_scheduler=cosine never "
            "decayed the learning rate") in err


def test_spec_lenience_and_topk_reach_the_engine_and_executor(tiny_model_dir, tmp_path, monkeypatch):
    """rollout.spec_lenience scales the acceptance test (0.01 keeps about one old token in a hundred where 1
    keeps most of them); rollout.spec_topk is what the engine records per token."""
    import rollwise.engine.factory as factory

    recorded = []

    class Recording(factory.ContinuousEngine):
        def __init__(self, *a, **kw):
            recorded.append(kw["record_topk"])
            super().__init__(*a, **kw)

    monkeypatch.setattr(factory, "ContinuousEngine", Recording)
    rates = {}
    for lenience in (1.0, 0.01):
        extra = ["rollout.speculative_reuse=true", f"rollout.spec_lenience={lenience}", "rollout.spec_topk=5",
                 "rollout.num_slots=4", "rollout.max_completion_length=12", "data.train_size=8",
                 "eval.at_start=false", "eval.at_end=false"]
        assert main(["train", *_args(tiny_model_dir, tmp_path, f"len{lenience}", 4, extra)]) == 0
        rows = _train_lines(tmp_path / f"len{lenience}")
        seen = [r["spec/acceptance_rate"] for r in rows if r["spec/candidates"] > 0]
        assert seen, "no prompt came back with responses to verify"
        rates[lenience] = sum(seen) / len(seen)
    assert recorded == [5, 5]
    assert rates[1.0] > 0.1 and rates[0.01] < rates[1.0] / 2  # measured: 0.76 and 0.0


def test_resume_refuses_items_rebuilt_differently(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A resume rebuilds the training set from the config; if it comes out different (another
    reasoning-gym version, or items now left out), the planner's belief would point at other prompts."""
    import dataclasses

    import rollwise.loop as loop

    assert main(["train", *_args(tiny_model_dir, tmp_path, "dd", 2)]) == 0
    run = tmp_path / "dd"
    real = loop.build_items

    def changed(cfg, seed):
        train, evals = real(cfg, seed)
        train[0] = dataclasses.replace(train[0], answer=train[0].answer + "0")
        return train, evals

    monkeypatch.setattr(loop, "build_items", changed)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.max_steps=3"]) == 2
    assert "differ from the ones the run was trained on" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["train", "--resume", str(run), "train.max_steps=3"]) == 0
    assert [r["step"] for r in _train_lines(run)] == [1, 2, 3]


def test_the_reward_worker_starts_during_setup(tiny_model_dir, tmp_path, monkeypatch):
    """Its start-up (seconds of imports) belongs to time/setup_s: started at the first score it was
    booked into the first step's time/reward_s and time/step_s, on every start and resume."""
    from rollwise.rewards.runner import RewardRunner

    running = []
    score = RewardRunner.score
    monkeypatch.setattr(RewardRunner, "score", lambda self, *a: (running.append(self._conn is not None),
                                                                 score(self, *a))[1])
    assert main(["train", *_args(tiny_model_dir, tmp_path, "r", 1, ["eval.at_start=false", "eval.at_end=false"])]) == 0
    assert running and running[0]


def test_the_periodic_evaluation_at_the_last_step_runs_without_the_final_one(tiny_model_dir, tmp_path, capsys):
    extra = ["eval.at_start=false", "eval.at_end=false", "eval.every_n_steps=2"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "noend", 4, extra)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "noend" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [2, 4]  # step 4's was folded into a final one never run


def test_a_budget_that_ends_the_run_at_the_first_update_after_warm_up_warns(tiny_model_dir, tmp_path, capsys):
    # the first update after warm-up runs at the full rate: 3 updates with warmup_steps=2 never decayed
    extra = ["eval.at_start=false", "eval.at_end=false", "train.lr_scheduler=linear", "train.warmup_steps=2",
             "train.max_rollout_tokens=300", "planner.strategy=uniform"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "wu", 10, extra)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "wu" / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["train/lr"] for r in rows if "train/lr" in r]
    assert len(lrs) == 3 and lrs[-1] == lrs[-2] and "never decayed the learning rate" in capsys.readouterr().err


def test_a_run_started_with_relative_paths_evaluates_from_another_folder(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_model_dir.parent)
    rel = ["model.name_or_path=" + tiny_model_dir.name, "eval.at_start=false", "eval.at_end=false"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "rel", 2, rel)]) == 0
    saved = yaml.safe_load((tmp_path / "rel" / "config.yaml").read_text())
    assert saved["model"]["name_or_path"] == str(tiny_model_dir.resolve())  # was "model", read from the cwd
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(tmp_path / "rel")]) == 0


def test_a_lora_resume_equals_uninterrupted(tiny_model_dir, tmp_path):
    # the engine's merged weights were merge_adapter() then unmerge_adapter(): the frozen base drifted by rounding
    # with every step, so a run resumed from the base on disk trained on other weights than an uninterrupted one
    lora = ["eval.at_start=false", "eval.at_end=false", "model.lora.enabled=true", "model.lora.r=4",
            "train.learning_rate=0.03"]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "full", 4, lora)]) == 0
    assert main(["train", *_args(tiny_model_dir, tmp_path, "half", 2, lora)]) == 0
    assert main(["train", "--resume", str(tmp_path / "half"), "train.max_steps=4"]) == 0
    assert _train_lines(tmp_path / "full") == _train_lines(tmp_path / "half")
    a = load_file(str(tmp_path / "full" / "checkpoints" / "step_000004" / "weights.safetensors"))
    b = load_file(str(tmp_path / "half" / "checkpoints" / "step_000004" / "weights.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
