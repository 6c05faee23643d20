"""Every setting a resume may change is in effect after the resume, or the resume refuses it.

Audits found settings that a resume accepted, wrote into config.yaml and then ignored, because the
checkpoint's saved state (optimizer, scheduler, planner, executor, banks) overrode them. Testing key by
key misses the next one, so this test enumerates the whole config. Every key is in one of:
- CHANGES: a value that must change what the resumed steps do. A tiny run trains 2 steps with the base
  value; one copy is resumed for 2 more steps with the key changed, another with nothing changed, and what
  the change must move (the trained weights, the held-out evaluation, the logged metrics or the run
  folder's files) has to differ between the two. Values are chosen so that the change shows within two steps.
- PLANNER_CHANGES: the same for planner settings, through the real planner and executor on a scripted
  engine for 10 steps after the resume (two tiny steps are too few for a planner's decisions to show).
- REFUSED (and LORA): a resume with it stops with a clear error and leaves the run as it was.
- rollwise.loop's START_ONLY: it shapes a run's start; the resume goes on from the checkpoint and says so.
- EXEMPT: with the reason it cannot be checked this way.
A new config key in none of them fails `test_every_config_key_is_classified`."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from test_e2e import _args
from test_option_matrix import _run

from rollwise.cli import main
from rollwise.config import build_config, config_to_dict
from rollwise.loop import FIXED_ON_RESUME, START_ONLY

BASE_STEPS, RESUMED_STEPS = 2, 4
QUIET = ("eval.at_start=false", "eval.at_end=false")
EVAL = ("eval.at_start=false", "eval.at_end=true")
REVISITS = ("data.train_size=8",)  # prompts come back every other step: reuse and revisit settings can act
TWO_PASSES = ("algo.num_iterations=2",)  # the ratio moves off 1, so clipping settings can act
# the tiny model rarely ends an answer; longer answers end at different lengths, so groups finish apart
LONG = ("rollout.max_completion_length=48",)
PARTIAL = ("rollout.partial_rollouts=true", "rollout.partial_stop_fraction=0.25", *LONG)


# key: (changed value, the base run's extra settings (also kept by both resumes), what must differ)
CHANGES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "model.dtype": ("bfloat16", (), "weights"),
    "model.lora.dropout": ("0.5", ("model.lora.enabled=true",), "weights"),
    "reward.functions": ("[{name: 'rewards_for_tests:space_share'}]", (), "weights"),
    "reward.timeout": ("0.1", ("reward.functions=[{name: 'rewards_for_tests:slow_digit_share'}]",), "weights"),
    "reward.truncated_reward": ("0", (), "weights"),
    "reward.overlong_buffer": ("4", (), "weights"),
    "reward.overlong_penalty": ("0.1", ("reward.overlong_buffer=4",), "weights"),
    "rollout.prompts_per_step": ("2", (), "weights"),
    "rollout.num_generations": ("3", (), "weights"),
    "rollout.max_completion_length": ("4", (), "weights"),
    "rollout.temperature": ("0.5", (), "weights"),
    "rollout.top_p": ("0.5", (), "weights"),
    "rollout.top_k": ("3", (), "weights"),
    "rollout.engine": ("hf", (), "weights"),
    "rollout.engine_dtype": ("bfloat16", (), "metrics"),  # the same samples, other log-probs
    "rollout.partial_rollouts": ("true", ("rollout.partial_stop_fraction=0.25", *LONG), "metrics"),
    "rollout.partial_stop_fraction": ("0.9", PARTIAL, "weights"),
    "rollout.overlap_rounds": ("false", LONG, "metrics"),
    "rollout.retention_limit": ("1", PARTIAL, "weights"),
    "rollout.speculative_reuse": ("true", REVISITS, "weights"),
    "rollout.spec_lenience": ("0.1", ("rollout.speculative_reuse=true", *REVISITS), "weights"),
    "rollout.spec_topk": ("1", ("rollout.speculative_reuse=true", "data.train_size=4"), "weights"),  # every step revisits
    "algo.advantage": ("rloo", (), "weights"),
    "algo.scale_rewards": ("none", (), "weights"),
    "algo.policy_loss": ("gspo", TWO_PASSES, "weights"),
    "algo.loss_type": ("dr_grpo", (), "weights"),
    "algo.epsilon": ("0.001", TWO_PASSES, "weights"),
    "algo.epsilon_high": ("0.3", TWO_PASSES, "weights"),
    "algo.dual_clip": ("1.0001", TWO_PASSES, "weights"),
    "algo.beta": ("0.5", (), "weights"),
    "algo.kl_estimator": ("k1", ("algo.beta=0.5", *TWO_PASSES), "weights"),
    "algo.entropy_coef": ("0.5", (), "weights"),
    "algo.mask_truncated_completions": ("true", (), "weights"),
    "algo.num_iterations": ("2", (), "weights"),
    "algo.offpolicy_correction": ("mask_resumed", PARTIAL, "weights"),
    "train.max_rollout_tokens": ("200", (), "metrics"),
    "train.learning_rate": ("0.0003", (), "weights"),
    "train.weight_decay": ("0.5", (), "weights"),
    "train.adam_beta1": ("0.5", (), "weights"),
    "train.adam_beta2": ("0.5", (), "weights"),
    "train.warmup_steps": ("10", (), "weights"),
    "train.lr_scheduler": ("linear", (), "weights"),
    "train.max_grad_norm": ("0.001", (), "weights"),
    "train.skip_zero_advantage": ("false", (), "metrics"),  # the same gradient by design: train/forwarded_sequences
    # the settings the out-of-memory message names: the same result by design, other numbers by rounding and the
    # engine's draw order, which shows the resume reads them
    "rollout.batch_size": ("2", (), "weights"),
    "rollout.num_slots": ("2", (), "weights"),
    "planner.success_threshold": ("0.1", REVISITS, "weights"),
    "eval.every_n_steps": ("1", (), "eval"),
    "eval.at_end": ("true", (), "eval"),
    "eval.pass_k": ("2", EVAL, "eval"),
    "eval.max_completion_length": ("2", EVAL, "eval"),
    "eval.save_best": ("true", ("eval.every_n_steps=1",), "files"),
    "eval.early_stopping_patience": ("1", ("eval.every_n_steps=1",), "metrics"),
    "run.save_every": ("1", (), "files"),
    "run.keep_checkpoints": ("1", (), "files"),
    "run.tensorboard": ("false", (), "files"),
    "distributed.max_staleness": ("0", ("distributed.async_training=true",), "weights"),
}

# A planner key: (changed value, strategy, the run's other planner settings). These go through the real planner
# and executor on test_option_matrix's scripted engine (48 prompts, two tasks, right-or-wrong rewards), resumed
# at step 6 of 16: a tiny model's two steps are too few for a planner's decisions to show a change.
PLANNER_CHANGES: dict[str, tuple[object, str, dict]] = {
    "planner.selector": ("all", "adaptive", {}),
    "planner.allocator": ("fixed", "adaptive", {}),
    "planner.repair": ("none", "adaptive", {}),
    "planner.budget_rollouts": (32, "adaptive", {}),
    "planner.budget_tokens": (300, "adaptive", {}),
    "planner.min_samples_per_prompt": (6, "knapsack", {}),
    "planner.max_samples_per_prompt": (12, "adaptive", {}),  # at n = 8: growth stops at 12, not 16
    "planner.posterior_decay": (0.1, "mopps", {}),
    "planner.vade_fast_decay": (0.01, "vade", {}),
    "planner.vade_slow_decay": (0.01, "vade", {}),
    "planner.vade_fast_weight": (0.99, "vade", {}),
    "planner.estimator_window": (1, "e3", {}),
    "planner.min_observations": (20, "knapsack", {}),
    "planner.group_prior": (True, "adaptive", {"group_prior": False}),  # pooled -> by task
    "planner.length_prior": (True, "adaptive", {}),
    "planner.target_solve_rate": (0.05, "mopps", {}),
    "planner.selection_score": ("info", "adaptive", {}),
    "planner.candidate_factor": (1.0, "adaptive", {}),
    "planner.stratify": (False, "adaptive", {}),
    "planner.stratify_rollouts": (False, "adaptive", {}),
    "planner.filter_zero_variance": (True, "uniform", {}),
    "planner.dapo_max_rounds": (1, "dapo", {}),
    "planner.dapo_oversample": (3.0, "dapo", {}),
    "planner.greso_explore_step": (0.5, "greso", {}),
    "planner.greso_explore_min": (0.9, "greso", {}),
    "planner.greso_explore_max": (0.06, "greso", {}),
    "planner.greso_zero_variance_target": (0.9, "greso", {}),
    "planner.greso_easy_threshold": (0.01, "greso", {}),
    "planner.greso_hard_threshold": (0.9, "greso", {}),
    "planner.ar3po_stages": (1, "ar3po", {}),
    "planner.ar3po_stage_size": (2, "ar3po", {}),
    "planner.staged_rule": ("while_informative", "ar3po", {}),
    "planner.screen_size": (4, "adaptive", {}),
    "planner.screen_threshold": (0.0, "adaptive", {}),
    "planner.screen_growth": ("eager", "adaptive", {}),
    "planner.screen_followup": ("next_step", "adaptive", {}),
    "planner.dars_schedule": ("hw", "dars", {}),
    "planner.length_ema": (0.9, "knapsack", {"budget_tokens": 300}),
    "planner.revisit_cooldown": (3, "adaptive", {}),
    "planner.revisit_discount": (0.01, "adaptive", {}),
    "planner.score_per_token": (True, "adaptive", {}),
    "planner.seed": (5, "mopps", {}),
}

# key: a changed value a resume must refuse (the checkpoint's state was made with the old one)
REFUSED: dict[str, str] = {
    **{f"data.{k}": v for k, v in {"tasks": "[{name: leg_counting}]", "train_size": "30", "eval_size": "4",
                                   "instruction": "go", "max_prompt_length": "64",
                                   "system_prompt": "brief", "use_chat_template": "false"}.items()},
    "run.seed": "7", "model.name_or_path": "elsewhere", "model.lora.enabled": "true", "planner.strategy": "uniform",
    "planner.estimator": "window",  # the other parts can change (PLANNER_CHANGES)
    "run.name": "other", "run.output_dir": "elsewhere", "distributed.async_training": "true",
    "distributed.backend": "ray",
}
LORA = {"model.lora.r": "2", "model.lora.alpha": "3", "model.lora.target_modules": "[q_proj]"}  # refused too

EXEMPT: dict[str, str] = {
    "model.device": "cuda needs a GPU; tests/test_errors.py checks the refusal without one",
    "model.cache_dir": "where a built-in model's converted folder is kept; a model given by path never reads it",
    "rollout.transpose_weights": "a matmul layout for speed (tests/test_engine.py: the same logits)",
    "rollout.partial_keep_kv": "keeps carried samples' KV cache instead of recomputing it: the same tokens",
    "rollout.vllm_gpu_memory_utilization": "vLLM only (GPU)",
    "algo.tis_cap": "needs off-policy tokens, which two tiny steps do not make often enough (tests/test_offpolicy.py)",
    "algo.decoupled_cap": "as algo.tis_cap",
    "algo.m2po_tau": "as algo.tis_cap",
    "algo.icepop_low": "as algo.tis_cap",
    "algo.icepop_high": "as algo.tis_cap",
    "algo.icepop_weighted": "as algo.tis_cap",
    "train.max_steps": "every resume here changes it: the resumed run trains to the new count",
    "train.disable_dropout": "the tiny model has no dropout; the trainer applies it whenever it is built, a resume "
    "included (tests/test_trainer_audit.py: the update's forward passes become deterministic)",
    "train.logprob_chunk": "memory of the log-prob pass: the same numbers (tests/test_training.py)",
    "train.micro_batch_size": "memory of the update: the same gradient by design (tests/test_training.py), other bits "
                              "only by rounding, which a CPU may not show",
    "train.gradient_checkpointing": "recomputes activations: the same gradients (tests/test_training.py)",
    "train.share_prompt_forward": "one forward of a shared prompt: the same gradients (tests/test_training.py)",
    "eval.batch_size": "read by `rollwise eval` only",
    "eval.early_stopping_min_delta": "needs an accuracy that moves; the tiny model's stays 0 (tests/test_best.py)",
    "run.torch_threads": "speed",
    "run.progress": "the console's progress bars",
    "distributed.rollout_workers": "Ray workers (tests/test_distributed_options.py); Ray is too slow to start here",
    "distributed.ray_address": "as distributed.rollout_workers",
    "distributed.worker_threads": "as distributed.rollout_workers",
    "distributed.max_worker_restarts": "as distributed.rollout_workers",
    "distributed.worker_timeout": "as distributed.rollout_workers",
    "distributed.worker_gpus": "as distributed.rollout_workers",
    "distributed.weight_sync_tokens": "as distributed.rollout_workers",
}


def _leaves(d: dict, prefix: str = "") -> list[str]:
    return [k for key, v in d.items()
            for k in (_leaves(v, f"{prefix}{key}.") if isinstance(v, dict) else [f"{prefix}{key}"])]


def test_every_config_key_is_classified():
    keys = set(_leaves(config_to_dict(build_config({}))))
    classified = [*CHANGES, *PLANNER_CHANGES, *REFUSED, *LORA, *START_ONLY, *EXEMPT]
    assert len(classified) == len(set(classified)), "a key is in two of CHANGES, REFUSED, START_ONLY and EXEMPT"
    assert sorted(keys - set(classified)) == [], "new settings: add each to CHANGES, REFUSED, START_ONLY or EXEMPT"
    assert sorted(set(classified) - keys) == [], "settings that no longer exist"
    assert all(k.startswith(FIXED_ON_RESUME) for k in LORA)


def _footprint(run: Path) -> dict:
    """What the resumed steps did: the final weights, the logged rows after the base steps (times left
    out), the evaluation rows, and the run folder's files (tensorboard's by count: their names hold a time)."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if not k.startswith(("time/", "rollout/tokens_per_s"))} for r in rows
            if r.get("step", 0) > BASE_STEPS]
    ckpts = sorted((run / "checkpoints").glob("step_*"))
    files = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file() and "tensorboard" not in p.parts
                   and p.name not in ("environment.json", "config.yaml", ".lock"))
    return {"weights": hashlib.sha256((ckpts[-1] / "weights.safetensors").read_bytes()).hexdigest(),
            "metrics": [r for r in rows if "eval/accuracy" not in r],
            "eval": [r for r in rows if "eval/accuracy" in r],
            "files": files + [f"{len(list((run / 'tensorboard').glob('*')))} tensorboard files"]}


@pytest.fixture(scope="module")
def bases(tmp_path_factory, tiny_model_dir):
    """One 2-step run per base setting, and its resume with nothing changed (the control), made once."""
    root, made = tmp_path_factory.mktemp("resume_settings"), {}

    def get(extra: tuple[str, ...]) -> tuple[Path, dict]:
        if extra not in made:
            name = f"base{len(made)}"
            settings = [*QUIET, *extra] if not any(e.startswith("eval.") for e in extra) else [*extra]
            assert main(["train", *_args(tiny_model_dir, root, name, BASE_STEPS, settings)]) == 0
            shutil.copytree(root / name, root / f"{name}-control")
            assert main(["train", "--resume", str(root / f"{name}-control"), f"train.max_steps={RESUMED_STEPS}"]) == 0
            made[extra] = (root / name, _footprint(root / f"{name}-control"))
        return made[extra]
    return get


@pytest.mark.parametrize("key", sorted(CHANGES))
def test_a_resume_puts_a_changed_setting_in_effect(key, bases, tmp_path):
    value, extra, where = CHANGES[key]
    base, control = bases(extra)
    run = tmp_path / "changed"
    shutil.copytree(base, run)
    assert main(["train", "--resume", str(run), f"train.max_steps={RESUMED_STEPS}", f"{key}={value}"]) == 0
    changes = json.loads((run / "environment.json").read_text())[-1]["config_changes"]
    assert key in changes, changes  # said, and written into config.yaml
    assert _footprint(run)[where] != control[where], f"{key}={value} at the resume changed nothing in its {where}"


@pytest.mark.parametrize("key", sorted({**REFUSED, **LORA}))
def test_a_resume_refuses_a_setting_its_checkpoint_cannot_carry(key, bases, tmp_path, capsys):
    base, _ = bases(())
    run = tmp_path / "refused"
    shutil.copytree(base, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    capsys.readouterr()
    assert main(["train", "--resume", str(run), f"train.max_steps={RESUMED_STEPS}", f"{key}={REFUSED.get(key) or LORA[key]}"]) == 2
    err = capsys.readouterr().err
    assert key in err and ("start a new run" in err or "Resume without" in err or "cannot" in err), err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"} == before


# a START_ONLY key: (changed value, the base run's extra settings); "{counts}" is a counts file
START_VALUES = {"planner.prior_counts": ("{counts}", ()), "planner.greso_explore_init": ("0.05", ("planner.strategy=greso",)),
                "eval.at_start": ("true", ())}


@pytest.mark.parametrize("key", sorted(START_ONLY))
def test_a_resume_says_a_start_only_setting_does_not_apply_and_goes_on_from_the_checkpoint(key, bases, tmp_path, capsys):
    value, extra = START_VALUES[key]
    counts = tmp_path / "counts.jsonl"
    counts.write_text(json.dumps({"uid": "chain_sum:train:0", "successes": 1, "samples": 2}) + "\n")
    base, control = bases(extra)
    run = tmp_path / "start_only"
    shutil.copytree(base, run)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), f"train.max_steps={RESUMED_STEPS}", f"{key}={value.format(counts=counts)}"]) == 0
    assert f"rollwise: note: the resume changes {key}, but" in capsys.readouterr().err
    assert _footprint(run) == control


@pytest.mark.parametrize("key", sorted(PLANNER_CHANGES))
def test_a_resume_puts_a_changed_planner_setting_in_effect(key):
    value, strategy, planner = PLANNER_CHANGES[key]
    field = key.removeprefix("planner.")
    _, _, _, control = _run(strategy, "plain", None, steps=16, resume_at=6, planner=planner)
    _, _, _, changed = _run(strategy, "plain", None, steps=16, resume_at=6, planner=planner, changes={field: value})
    assert changed[:6] == control[:6]
    assert changed[6:] != control[6:], f"{key}={value} at the resume changed none of the planner's decisions"
