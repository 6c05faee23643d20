"""The synchronous loop, top to bottom: plan -> generate -> reward -> advantages -> update.

Read `train()` in one sitting; everything it calls is a small piece with its own module.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from rollwise import ui
from rollwise.config import (
    Config,
    ConfigError,
    build_config,
    config_changes,
    config_to_dict,
    leaves,
    read_run_config,
    unused_settings,
)
from rollwise.data import build_items, encode_prompts
from rollwise.data.tasks import repeated_questions_note
from rollwise.engine import HFEngine
from rollwise.engine.executor import RolloutExecutor
from rollwise.engine.factory import build_engine, check_context_length
from rollwise.environment import default_threads, record_environment, replace_text
from rollwise.evaluate import evaluate, is_correct, success_not_correct
from rollwise.models import (
    BUILTIN_MODELS,
    ModelError,
    apply_lora,
    compute_dtype,
    load_model,
    load_tokenizer,
    merged_state_dict,
    resolve_model_path,
    slow_dtype_warning,
)
from rollwise.planner import GroupResult, Request, build_planner
from rollwise.rewards import RewardRunner
from rollwise.rewards.verifiers import lenient_scorer_note, multiline_answers_note
from rollwise.runlock import lock_run_dir
from rollwise.tracking import Tracker, read_metrics
from rollwise.training.best import (
    METRIC,
    BestTracker,
    beats_saved_best,
    best_dir,
    restore_interrupted_best,
    resume_best,
    save_best_weights,
    saved_best_lags,
)
from rollwise.training.checkpoint import (
    CheckpointError,
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint_state,
    load_checkpoint_weights,
    remove_partial_writes,
    save_checkpoint,
    set_rng_state,
)
from rollwise.training.policy import PolicyTrainer
from rollwise.types import PromptItem, Sample
from rollwise.ui import StepProgress, print_summary, start_again_command


@dataclass
class RunResult:
    run_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    eval_before: dict[str, float] = field(default_factory=dict)
    eval_after: dict[str, float] = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_threads(n: int | None) -> int:
    # OMP_NUM_THREADS where set, else the cores this process may use, not the machine's (two runs on 2 cores: 50x
    # slower)
    n = n or default_threads()
    torch.set_num_threads(n)
    return n


def warn_slow_dtype(cfg: Config) -> None:
    """One line on stderr when an explicit bf16/fp16 would be emulated on this CPU."""
    msg = slow_dtype_warning(cfg.model.dtype, cfg.model.device)
    if msg:
        print(f"rollwise: warning: {msg}", file=sys.stderr)


def warn_idle_gpu(cfg: Config) -> None:
    """One line on stderr when a CUDA GPU is there but the config trains and generates on the CPU."""
    if cfg.model.device == "cpu" and cfg.rollout.engine != "vllm" and torch.cuda.is_available():
        print(f"rollwise: warning: {torch.cuda.get_device_name(0)} is available but model.device=cpu; set "
              "model.device=cuda to train and generate on it", file=sys.stderr)


def warn_unused_settings(cfg: Config) -> None:
    """One line on stderr per option set away from its default that this config never reads."""
    for line in unused_settings(cfg):
        print(f"rollwise: warning: {line}", file=sys.stderr)


def local_path(path: str) -> str:
    """A local path as an absolute one (a run's config.yaml read from elsewhere, actors that start in another
    folder); a hub id, a built-in name or a module unchanged."""
    p = Path(path).expanduser()
    return str(p.resolve()) if p.exists() else path


def absolute_paths(cfg: Config) -> Config:
    """`cfg` with its local files and folders (the model and its cache, file tasks, reward files, prior counts) as absolute
    paths, so that the run's config.yaml works from any folder (`rollwise eval`, `export`, `--resume`); built-in
    model names, hub ids and importable modules stay as given."""
    data = config_to_dict(cfg)
    if cfg.model.name_or_path not in BUILTIN_MODELS:
        data["model"]["name_or_path"] = local_path(cfg.model.name_or_path)
    if cfg.model.cache_dir:  # always a local folder, made when first used: absolute whether there yet or not
        data["model"]["cache_dir"] = str(Path(cfg.model.cache_dir).expanduser().resolve())
    for task in data["data"]["tasks"]:
        if task.get("path"):
            task["path"] = local_path(task["path"])
    for fn in data["reward"]["functions"]:
        file, sep, name = fn["name"].rpartition(":")
        if sep and file.endswith(".py"):
            fn["name"] = f"{local_path(file)}:{name}"
    if cfg.planner.prior_counts:
        data["planner"]["prior_counts"] = local_path(cfg.planner.prior_counts)
    return build_config(data)


def prepare_run_dir(cfg: Config, resume: str | None, create: bool = True) -> tuple[Path, Config]:
    """The run's folder (checked; with `create`, made and its config.yaml written, local paths made absolute)."""
    if resume:
        run_dir = Path(resume)
        if not (run_dir / "config.yaml").is_file():
            raise FileNotFoundError(f"--resume {resume}: no config.yaml there; not a rollwise run folder")
        lock_run_dir(run_dir)
        return run_dir, absolute_paths(cfg) if create else cfg  # an override's local file as a fresh start's
    name = cfg.run.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(cfg.run.output_dir) / name
    if run_dir.is_dir():  # an earlier attempt's folder: not while that attempt still runs
        lock_run_dir(run_dir)
    if latest_checkpoint(run_dir) is not None:  # a step checkpoint; a half-written one or a best alone is no run to resume
        raise FileExistsError(f"run folder {run_dir} already has checkpoints: use --resume {run_dir} or a new run.name")
    if not create:
        return run_dir, cfg
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_run_dir(run_dir)
    cfg = absolute_paths(cfg)
    write_config(run_dir, cfg)
    return run_dir, cfg


def set_aside_earlier_best(run_dir: Path) -> None:
    """A fresh start in a folder whose earlier start saved a best but no step checkpoint: that best is
    moved to checkpoints/best_earlier_start (best_earlier_start_2, _3 ... when an earlier one is there: kept,
    not taken for this run's), and half-written checkpoint folders are removed."""
    restore_interrupted_best(run_dir)  # an earlier start killed while replacing its best left it as .old_best
    remove_partial_writes(run_dir)
    best = best_dir(run_dir)
    if best.is_dir():
        aside = next(p for i in itertools.count(1)
                     if not (p := best.with_name("best_earlier_start" + (f"_{i}" if i > 1 else ""))).exists())
        best.rename(aside)
        print(f"rollwise: the earlier start's {best} is moved to {aside}; this run saves its own best", file=sys.stderr)


def load_resumed_config(run_dir: str, overrides: dict[str, Any]) -> Config:
    """The saved config of a run, with command-line overrides (for example a larger max_steps)."""
    from rollwise.config import ConfigError, _merge

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"--resume {run_dir}: no config.yaml there; not a rollwise run folder "
                                "(give the folder `rollwise train` printed as 'run folder: ...')")
    saved = read_run_config(run_dir)
    run_over = overrides.get("run") if isinstance(overrides.get("run"), dict) else {}
    was_run = saved.get("run") or {}
    if "output_dir" in run_over and same_folder(run_over["output_dir"], was_run.get("output_dir")):
        # the run's own folder named another way (~, relative): no move, and config.yaml keeps it as saved
        overrides = {**overrides, "run": {k: v for k, v in run_over.items() if k != "output_dir"}}
        run_over = overrides["run"]
    moved = sorted(k for k in ("name", "output_dir") if k in run_over and run_over[k] != was_run.get(k))
    if moved:
        raise ConfigError(f"--resume continues the run in {run_dir}; run.{' and run.'.join(moved)} cannot move it. "
                          "Copy the folder and resume the copy, or start a new run")
    try:
        cfg = build_config(_merge(saved, overrides))
    except ConfigError as e:
        try:
            build_config(saved)
        except ConfigError:  # the saved file itself (a key an older or newer rollwise wrote): an override cannot fix it
            raise ConfigError(f"{path}, the run's saved settings: {e}\nEdit that file (a key this version of rollwise "
                              "does not know can be deleted), then resume") from None
        raise
    # local paths as config.yaml keeps them (absolute): the same model or data file given relatively is no change
    was, now = leaves(saved), leaves(config_to_dict(absolute_paths(cfg)))
    for key in leaves(overrides):
        if key.startswith(FIXED_ON_RESUME) and key in was and was[key] != now.get(key):
            raise ConfigError(f"--resume cannot change {key} ({was[key]} -> {now.get(key)}): the checkpoint's training "
                              "set, planner belief and weights were made with it. Resume without it, or start a new "
                              f"run with {key}={now.get(key)}")
    loops = [loop_kind(w) for w in (was, now)]
    if loops[0] != loops[1]:
        raise ConfigError(f"--resume {run_dir}: the run's checkpoints were written by the {loops[0]} loop and this "
                          f"resume asks for the {loops[1]} one (distributed.async_training, distributed.backend); "
                          "they save different state. Resume without changing those settings, or start a new run")
    ckpt = latest_checkpoint(Path(run_dir))
    at = checkpoint_step(ckpt) if ckpt is not None else 0
    if at > cfg.train.max_steps:
        raise ConfigError(f"--resume {run_dir}: the run's last checkpoint is at step {at}, past train.max_steps="
                          f"{cfg.train.max_steps}; to train on, give a train.max_steps above {at}")
    return cfg


def same_folder(a: Any, b: Any) -> bool:
    """Whether two run.output_dir values name one folder (`~/runs`, `runs` from the current folder, `/home/me/runs`)."""
    if not isinstance(a, str) or not isinstance(b, str):
        return a == b
    return a == b or Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def loop_kind(leaves: dict[str, Any]) -> str:
    """Which training loop a config's flat keys select: the synchronous one, or the asynchronous one
    (distributed.async_training, or Ray rollout workers)."""
    ray = leaves.get("distributed.backend", "local") == "ray"
    return "asynchronous" if leaves.get("distributed.async_training", False) or ray else "synchronous"


# Settings a checkpoint's state depends on: the training set (data.*, and run.seed, which draws it),
# the weights (model.name_or_path; the LoRA adapters' presence, rank and modules) and the planner's state
# (planner.strategy).
FIXED_ON_RESUME = ("data.", "run.seed", "model.name_or_path", "model.lora.enabled", "model.lora.r",
                   "model.lora.alpha", "model.lora.target_modules", "planner.strategy")


# Settings that shape a run's start only: a resume that changes them continues from the checkpoint's state
START_ONLY = {
    "planner.prior_counts": "a resumed planner's belief comes from the checkpoint; the file is read only at a run's start",
    "planner.greso_explore_init": "greso's skip probabilities continue from the checkpoint's (kept within "
    "planner.greso_explore_min and greso_explore_max); the initial value is used only at a run's start",
    "eval.at_start": "the evaluation before training is made only at a run's start",
}


def resumed_config_changes(run_dir: Path, cfg: Config) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """What a resume's overrides change in the run's config.yaml ({key: [old, new]}), each said on stderr,
    and the settings config.yaml lacks because a newer rollwise added them ({key: value}, said on one line).
    `write_config` writes the config once the checkpoint has loaded; both are kept in environment.json's
    entry for this resume, so the settings the earlier steps ran with are not lost."""
    changes, added = config_changes(read_run_config(run_dir), config_to_dict(cfg))
    # runs before 2026-12-07 kept a relative model.cache_dir, now saved absolute: the same folder is no change
    changes = {k: v for k, v in changes.items() if not (k == "model.cache_dir" and same_folder(*v))}
    for key, (was, new) in changes.items():
        print(f"rollwise: the resume changes {key}: {was} -> {new}", file=sys.stderr)
    if added:
        print(f"rollwise: {len(added)} setting(s) are newer than this run's config.yaml and take their defaults: "
              f"{', '.join(added)}", file=sys.stderr)
    return changes, added


def refuse_idle_changes(run: Run, changes: dict[str, list[Any]] | None) -> None:
    """A resume of a run that finished its train.max_steps, stopped early or spent its train.max_rollout_tokens,
    without a setting that lets it go on, trains no step: it must not record setting changes, or config.yaml and the
    summary would say the run used settings no step ran with, and `rollwise eval RUN_DIR` would score with them.
    The run's own settings (run.*) may change, and so may the setting that stops it (a patience or a token budget
    lowered to one already reached is recorded: it is what the run did) and, for a run stopped early or by its
    token budget, train.max_steps (how far it may go, not how a step trains; lowered to the step it stopped at too)."""
    changed = [k for k in changes or () if not k.startswith("run.")]
    cfg = run.cfg
    if not changed:
        return
    if run.best.should_stop:
        why = f"stopped early at step {run.start_step} (eval.early_stopping_patience={cfg.eval.early_stopping_patience})"
        stoppers = ("eval.early_stopping_patience", "eval.early_stopping_min_delta", "train.max_steps")
        more = "a larger eval.early_stopping_patience (or 0)"
    elif token_budget_spent(cfg, run.totals["tokens"]):
        why = (f"has spent its train.max_rollout_tokens={cfg.train.max_rollout_tokens} "
               f"({run.totals['tokens']:,.0f} tokens generated)")
        stoppers, more = ("train.max_rollout_tokens", "train.max_steps"), "a larger train.max_rollout_tokens"
    elif run.start_step >= cfg.train.max_steps:
        why, stoppers, more = f"has finished its train.max_steps={cfg.train.max_steps}", (), "a larger train.max_steps"
    else:
        return
    idle = [k for k in changed if k not in stoppers]
    if idle:
        raise ConfigError(f"--resume {run.run_dir}: the run {why}, so no step would train with the change to "
                          f"{', '.join(idle)}, and nothing was changed. To train on, give {more} as well; to evaluate "
                          f"its weights under other settings, use `rollwise eval {run.run_dir} KEY=VALUE ...`")


def write_config(run_dir: Path, cfg: Config) -> None:
    """config.yaml, replaced whole or not at all (a full disk mid-write leaves the old file)."""
    replace_text(run_dir / "config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


@dataclass
class Run:
    """What one training run holds; both loops (here and distributed/async_loop.py) share it."""

    cfg: Config
    run_dir: Path
    runner: RewardRunner
    primary: str
    tokenizer: Any
    model: torch.nn.Module
    model_path: str
    eos_ids: list[int]
    engine: HFEngine  # the rollout engine (synchronous loop) and the evaluation engine (both loops)
    trainer: PolicyTrainer
    items_by_uid: dict[str, PromptItem]
    ids_by_uid: dict[str, list[int]]
    eval_items: list[PromptItem]
    eval_ids: list[list[int]]
    planner: Any
    tracker: Tracker
    result: RunResult
    start_step: int = 0
    state: dict[str, Any] | None = None  # the loaded checkpoint's state
    checkpoint: Path | None = None  # and its folder
    replay_bank: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> its best response that succeeded
    totals: dict[str, int] = field(default_factory=lambda: {"rollouts": 0, "tokens": 0})
    best: BestTracker = field(default_factory=BestTracker)  # best eval/accuracy so far (save_best, early stopping)
    last_eval: tuple[int, dict[str, float]] | None = None  # (step, metrics) of the latest evaluation
    progress: Any = None  # the synchronous loop's progress bar (closed by close_on_failure)
    started: float = 0.0  # time.perf_counter() when setup began (time/setup_s)
    dropped_prompts: int = 0  # training prompts left out as longer than data.max_prompt_length


@dataclass
class Produced:
    """One step's batch and what it cost."""

    batch: list[Sample]
    generated: list[Sample]
    outcome: Any
    tokens: int
    gen_s: float
    reward_s: float
    reward_issues: tuple[int, int, int]  # errors, timeouts, NaNs
    executor_metrics: dict[str, float]


NO_CUDA = "model.device=cuda but torch sees no CUDA device; use model.device=cpu"


def load_policy(cfg: Config, path: str) -> torch.nn.Module:
    """The policy in fp32 master weights on `model.device` (LoRA is applied later, by `make_trainer`)."""
    model = load_model(path, torch.float32)
    if cfg.model.device == "cuda":
        if not torch.cuda.is_available():
            raise ModelError(NO_CUDA)
        model = model.to("cuda")
    return model


def make_trainer(cfg: Config, model: torch.nn.Module, pad_id: int, state: dict[str, Any] | None = None,
                 ckpt: Path | None = None) -> tuple[torch.nn.Module, PolicyTrainer]:
    """LoRA (when enabled) and the trainer; weights, optimizer and scheduler from a checkpoint when given."""
    if cfg.model.lora.enabled:
        model = apply_lora(model, cfg.model)
    trainer = PolicyTrainer(cfg, model, pad_id)
    if ckpt is not None:
        load_checkpoint_weights(ckpt, model)
        state = state if state is not None else load_checkpoint_state(ckpt)
    if state is not None:
        trainer.load_state_dict(state["trainer"])
    return model, trainer


def setup(cfg: Config, resume: str | None = None, with_trainer: bool = True, log_start: bool = True) -> Run:
    """Seed, run folder, data, rewards, model, engine, trainer, planner; the checkpoint's state when resuming.

    `with_trainer=False` (the trainer runs elsewhere, as a Ray actor) keeps only the engine's copy
    of the policy here; `run.model` and `run.trainer` are then None. `log_start=False` leaves the
    start's metrics row (`log_setup`) to the caller, to be written once the rest of its start is done."""
    t_start = time.perf_counter()
    set_threads(cfg.run.torch_threads)
    seed_everything(cfg.run.seed)
    warn_slow_dtype(cfg)
    warn_idle_gpu(cfg)
    warn_unused_settings(cfg)
    run_dir, cfg = prepare_run_dir(cfg, resume, create=False)
    if resume and latest_checkpoint(run_dir) is None:  # said before the model loads
        raise FileNotFoundError(f"--resume {run_dir}: no checkpoint in {run_dir / 'checkpoints'} (the run stopped "
                                "before its first one; run.save_every sets how often they are written): start it "
                                f"again with {start_again_command(run_dir)}")
    if cfg.model.device == "cuda" and cfg.distributed.backend == "local" and not torch.cuda.is_available():
        raise ModelError(NO_CUDA)  # before any folder is made (Ray's trainer actor may hold the GPU instead)

    # data and rewards (reward functions are imported here: fail before the model loads)
    if cfg.rollout.engine == "vllm" and cfg.distributed.backend == "local":  # Ray workers may have the GPU instead
        from rollwise.engine.vllm import require_vllm

        require_vllm()  # before any folder is made or model loaded
    runner = RewardRunner(cfg.reward)
    try:
        train_items, eval_items = build_items(cfg.data, cfg.run.seed)
        asks = f"{cfg.data.system_prompt or ''}\n{cfg.data.instruction}"  # what the prompt asks for, either place
        repeats = repeated_questions_note(train_items)
        if repeats:
            print(f"rollwise: note: {repeats}", file=sys.stderr)
        for note in (multiline_answers_note(train_items + eval_items, asks, cfg.reward.functions[0].name),
                     lenient_scorer_note(train_items + eval_items, cfg.reward.functions[0].name)):
            if note:
                print(f"rollwise: warning: {note}", file=sys.stderr)
        path = resolve_model_path(cfg.model.name_or_path, cfg.model.cache_dir)
        tokenizer = load_tokenizer(path)
        from transformers import AutoConfig

        context = check_context_length(AutoConfig.from_pretrained(path), cfg)  # an error for learned positions
        if context:
            print(f"rollwise: warning: {context}", file=sys.stderr)
        train_ids, dropped = encode_prompts(train_items, tokenizer, cfg.data)
        too_long = set(dropped)
        ids_by_uid = {it.uid: ids for it, ids in zip(train_items, train_ids) if it.uid not in too_long}
        if not ids_by_uid:
            raise ConfigError(f"no training prompts left: all {len(train_items)} are longer than "
                              f"data.max_prompt_length={cfg.data.max_prompt_length} tokens (chat template included); "
                              "raise data.max_prompt_length or check data.tasks")
        if dropped:  # said, as the held-out items left out are (data/dropped_long_prompts logs the count too)
            print(f"rollwise: warning: {len(dropped)} of {len(train_items)} training prompts are longer than "
                  f"data.max_prompt_length={cfg.data.max_prompt_length} tokens (chat template included) and are left "
                  "out of training; raise data.max_prompt_length to keep them", file=sys.stderr)
    except BaseException:
        runner.close()
        raise
    # the folder is made once the rewards, data, model path and prompts are known to be good (no empty folders)
    run_dir, cfg = prepare_run_dir(cfg, resume)
    ui.active_run_dir = run_dir  # the CLI's Ctrl-C message names it
    changes, added = resumed_config_changes(run_dir, cfg) if resume else (None, None)

    # model, engine (its own copy in the compute dtype, built before LoRA), trainer
    model: Any = load_policy(cfg, path)
    eos_ids = sorted({tokenizer.eos_token_id, *_as_list(getattr(model.generation_config, "eos_token_id", None))} - {None})
    engine = build_engine(cfg, model, eos_ids, tokenizer.pad_token_id, cfg.run.seed, path)

    eval_ids, eval_dropped = encode_prompts(eval_items, tokenizer, cfg.data)
    eval_too_long = set(eval_dropped)
    eval_keep = [i for i, it in enumerate(eval_items) if it.uid not in eval_too_long]
    if eval_dropped:  # as `rollwise eval` says it: eval/accuracy is over fewer items than data.eval_size
        none = "; none is left, so the run evaluates nothing" if not eval_keep else ""
        print(f"rollwise: warning: {len(eval_dropped)} of {len(eval_items)} held-out items are longer than "
              f"data.max_prompt_length={cfg.data.max_prompt_length} tokens and are left out of the run's "
              f"evaluations{none}; raise data.max_prompt_length to keep them", file=sys.stderr)
    ckpt = latest_checkpoint(run_dir) if resume else None
    # a resumed planner's belief comes from the checkpoint, so planner.prior_counts' file is not read again
    pcfg = cfg.planner.model_copy(update={"prior_counts": None}) if ckpt is not None else cfg.planner
    for key in set(changes or ()) & set(START_ONLY) if ckpt is not None else ():
        print(f"rollwise: note: the resume changes {key}, but {START_ONLY[key]}", file=sys.stderr)
    planner = build_planner(pcfg, list(ids_by_uid), cfg.rollout.prompts_per_step,
                            cfg.rollout.num_generations, cfg.rollout.max_completion_length, cfg.run.seed,
                            prompt_lengths=[len(ids) for ids in ids_by_uid.values()])
    state = load_checkpoint_state(ckpt) if ckpt is not None else None
    trainer: Any = None
    if with_trainer:
        model, trainer = make_trainer(cfg, model, tokenizer.pad_token_id, state, ckpt)
    else:
        model = None  # the engine holds its own copy
    run = Run(cfg, run_dir, runner, cfg.reward.functions[0].name, tokenizer, model, path, eos_ids, engine, trainer,
              {it.uid: it for it in train_items}, ids_by_uid, [eval_items[i] for i in eval_keep],
              [eval_ids[i] for i in eval_keep], planner, None, RunResult(run_dir))  # type: ignore[arg-type]
    run.best = BestTracker(cfg.eval.early_stopping_patience, cfg.eval.early_stopping_min_delta)
    if state is not None:
        saved = state["extra"].get("data")  # checkpoints before 2026-12-07 have none
        if saved is not None and saved != data_digest(run):
            raise CheckpointError(
                f"{ckpt}: the training and held-out items built for this resume differ from the ones the run was "
                "trained on (another reasoning-gym or datasets version, a changed data file, or a rollwise that now "
                "leaves out items with a wrong gold answer, or reads data files differently); the planner's belief and the data position would point "
                "at other prompts. Install the versions in the run's environment.json, or start a new run")
        try:
            planner.load_state_dict(state["extra"]["planner"])
        except (ValueError, KeyError, TypeError) as e:
            changed = f" (this resume changes {', '.join(changes)})" if changes else ""
            detail = f"no saved entry {e}" if isinstance(e, KeyError) else str(e)
            raise CheckpointError(f"{ckpt} cannot continue with this config{changed}: the planner state saved there "
                                  f"does not fit this run's planner ({detail}). Resume without the changed planner "
                                  "settings, or start a new run") from e
        bank_changes = dict(changes or {})
        was = state["extra"].get("bank_scored_under")  # None: older checkpoints, which did not record it
        if was is not None:  # config.yaml may hold an earlier resume's settings that never reached a checkpoint
            now = bank_settings(cfg)
            bank_changes = {**{k: v for k, v in bank_changes.items() if k not in now},
                            **{k: [was.get(k), v] for k, v in now.items() if was.get(k) != v}}
        run.replay_bank = fit_replay_bank(state["extra"]["replay_bank"], planner, cfg, bank_changes)
        run.totals = state["extra"]["totals"]
        if "best" in state["extra"]:  # checkpoints written before eval.save_best have none
            run.best.load_state_dict(state["extra"]["best"])
        run.start_step = state["step"]
        run.state, run.checkpoint = state, ckpt
        # a trainer that ran as a Ray actor saved its own RNG in "rng" and this process's in "driver_rng"
        set_rng_state(state["extra"].get("driver_rng", state["rng"]))
        restore_interrupted_best(run_dir)
        remove_partial_writes(run_dir)
        note = resume_best(run.best, run_dir, run.start_step, evaluated_at(run_dir, run.start_step))
        if note and cfg.eval.save_best:
            print(f"rollwise: {note}", file=sys.stderr)
        refuse_idle_changes(run, changes)
    if resume:  # the checkpoint took the config: now config.yaml may say so
        write_config(run_dir, cfg)
    dtype = str(compute_dtype(cfg.model.dtype, cfg.model.device)).removeprefix("torch.")
    record_environment(run_dir, run.start_step if ckpt else None, dtype, changes, added)
    earlier = run_dir / "metrics.jsonl"
    if ckpt is None and earlier.is_file() and earlier.stat().st_size:
        print(f"rollwise: {run_dir} holds an earlier start that wrote no checkpoint; its metrics are replaced",
              file=sys.stderr)
    if ckpt is None:
        set_aside_earlier_best(run_dir)
    # a fresh start keeps no metrics of an earlier one in the folder (-1: none), a resume those up to its checkpoint
    run.tracker = Tracker(run_dir, cfg.run.tensorboard, truncate_after_step=run.start_step if ckpt else -1)
    # the reward worker last (a setup error before this leaves none running): its start-up counts in
    # time/setup_s, not in the first step's time/reward_s
    try:
        run.runner.start()
    except BaseException:
        run.tracker.close()
        raise
    run.started, run.dropped_prompts = t_start, len(dropped)
    if log_start:
        log_setup(run)
    return run


def log_setup(run: Run) -> None:
    """The start's (or resume's) metrics: time/setup_s, the seconds from setup's start to now, and the
    held-out items the run evaluates (0: no final evaluation is due, which `rollwise report` reads)."""
    run.tracker.log(run.start_step, {"time/setup_s": time.perf_counter() - run.started,
                                     "data/eval_items": float(len(run.eval_items))})
    if run.dropped_prompts:
        run.tracker.log(run.start_step, {"data/dropped_long_prompts": float(run.dropped_prompts)})


def run_eval(run: Run, step: int, save_best: Callable[[int, float], None] | None = None) -> dict[str, float]:
    """Held-out evaluation with the run's engine (which must hold the current weights), counted
    toward the run's best; with eval.save_best a new best's weights are written by `save_best(step,
    accuracy)` (default: this process's policy)."""
    cfg = run.cfg
    te = time.perf_counter()
    m = evaluate(run.engine, run.eval_items, run.eval_ids, run.runner, run.primary, run.tokenizer,
                 cfg.eval.max_completion_length or cfg.rollout.max_completion_length, cfg.eval.pass_k,
                 cfg.rollout.temperature, cfg.run.seed)
    if m:
        m["time/eval_s"] = time.perf_counter() - te
        if METRIC in m:
            improved = run.best.observe(step, m[METRIC])
            if cfg.eval.save_best and (improved or saved_best_lags(run.run_dir, run.best.best)) \
                    and beats_saved_best(run.run_dir, m[METRIC]):
                (save_best or (lambda s, a: save_best_weights(run.run_dir, s, a, run.model)))(step, m[METRIC])
            m.update(run.best.metrics())
        run.tracker.log(step, m)
        run.last_eval = (step, m)
    return m


def evaluated_at(run_dir: Path, step: int) -> float | None:
    """The held-out accuracy metrics.jsonl holds for `step` (None when that step has no evaluation)."""
    path = Path(run_dir) / "metrics.jsonl"
    rows = read_metrics(run_dir, warn=False) if path.is_file() else []
    return next((float(r[METRIC]) for r in reversed(rows) if r.get("step") == step and METRIC in r), None)


def final_eval_due(run: Run, last_step: int) -> bool:
    """eval.at_end's evaluation is due after training, and on a resume that trains nothing when the
    run was stopped before its final evaluation was written (the checkpoint comes first)."""
    if not run.cfg.eval.at_end or last_step == 0:
        return False
    return last_step > run.start_step or evaluated_at(run.run_dir, last_step) is None


def final_eval(run: Run, last_step: int, save_best: Callable[[int, float], None] | None = None) -> dict[str, float]:
    """The evaluation after training (eval.at_end): the one already made at `last_step` when
    training stopped right after it (early stopping), else a new one."""
    if run.last_eval is not None and run.last_eval[0] == last_step:
        return run.last_eval[1]
    return run_eval(run, last_step, save_best)


def steps_to_train(run: Run, progress: StepProgress) -> range:
    """The steps the loop runs: none when a resumed run had already finished, stopped early or spent its
    rollout-token budget (it says which; a run at train.max_steps has finished, whatever its patience)."""
    return range(run.start_step, run.start_step if finished_before(run, progress) or stopped_early(
                 run, run.start_step, progress) or budget_spent_before(run, progress) else run.cfg.train.max_steps)


def finished_before(run: Run, progress: StepProgress) -> bool:
    """A resumed run already at train.max_steps: say so (a summary alone would read as a run that trained)."""
    if run.start_step == 0 or run.start_step < run.cfg.train.max_steps:
        return False
    say(progress, f"step {run.start_step}: the run had already finished its train.max_steps={run.cfg.train.max_steps}; "
        "nothing to train. To train on, resume with a larger train.max_steps")
    return True


def token_budget_spent(cfg: Config, tokens: float) -> bool:
    """train.max_rollout_tokens is set and `tokens` generated reach it."""
    return cfg.train.max_rollout_tokens is not None and tokens >= cfg.train.max_rollout_tokens


def say(progress: StepProgress, text: str) -> None:
    """A line above the progress bar, or on stderr when there is no bar."""
    progress.note(text) if progress.enabled else print(f"rollwise: {text}", file=sys.stderr)


def budget_spent_before(run: Run, progress: StepProgress) -> bool:
    """A resumed run whose train.max_rollout_tokens was already spent: say so rather than generate
    one more batch over the budget."""
    if not token_budget_spent(run.cfg, run.totals["tokens"]) or run.start_step >= run.cfg.train.max_steps:
        return False
    say(progress, f"step {run.start_step}: the rollout-token budget was already spent ({run.totals['tokens']:,.0f} "
        f"tokens generated, train.max_rollout_tokens={run.cfg.train.max_rollout_tokens}); to train on, resume with a "
        "larger train.max_rollout_tokens")
    return True


def stopped_early(run: Run, step: int, progress: StepProgress) -> bool:
    """eval.early_stopping_patience reached after the evaluation at `step`: say so."""
    if run.best.should_stop:
        again = (" (when the run was checkpointed); to train on, resume with a larger eval.early_stopping_patience "
                 "or 0") if step == run.start_step else ""
        say(progress, f"step {step}: {run.best.stop_note()}{again}")  # said even without a bar
    return run.best.should_stop


def produce_batch(run: Run, step: int, executor: Any, stream: bool = False) -> Produced:
    """plan -> generate -> reward, as many rounds as the planner asks for; then the batch to train on.

    `executor` is a RolloutExecutor (this process) or a RolloutPool (rollout workers). With
    `stream` each group is scored and shown to the planner as soon as it finishes, and the
    planner's follow-up requests join the running engine round (see `rollout.overlap_rounds`)."""
    planner, tokenizer = run.planner, run.tokenizer
    by_uid: dict[str, list[Sample]] = {}
    cost = {"absorb_s": 0.0, "reward_s": 0.0}
    issues = [0, 0, 0]

    def absorb(out: Any, ask: bool = True) -> list[Request]:
        """Score finished groups, keep their samples, tell the planner; its follow-up requests
        (when `ask`: a round of carried groups only asks for nothing more)."""
        ta = time.perf_counter()
        try:
            return _absorb(out, ask)
        finally:
            cost["absorb_s"] += time.perf_counter() - ta

    def _absorb(out: Any, ask: bool) -> list[Request]:
        owners = [u for grp in (out.groups, out.adopted) for u, outs in grp.items() for _ in outs]
        outs = [o for grp in (out.groups, out.adopted) for os_ in grp.values() for o in os_]
        texts = [tokenizer.decode(o.response_ids, skip_special_tokens=True) for o in outs]
        tr = time.perf_counter()
        scored = run.runner.score(texts, [run.items_by_uid[u] for u in owners])
        cost["reward_s"] += time.perf_counter() - tr
        issues[:] = [issues[0] + scored.errors, issues[1] + scored.timeouts, issues[2] + scored.nans]
        fresh: dict[str, list[Sample]] = {}
        rc = run.cfg.reward
        for uid, o, text, rew, parts in zip(owners, outs, texts, scored.rewards, scored.parts):
            if rc.truncated_reward is not None and o.finish_reason == "length":
                rew, parts = rc.truncated_reward, dict.fromkeys(parts, 0.0)
            if rc.overlong_buffer:
                rew -= overlong_punishment(len(o.response_ids), run.cfg.rollout.max_completion_length,
                                           rc.overlong_buffer, rc.overlong_penalty)
            s = Sample(uid, 0, run.ids_by_uid[uid], o.response_ids, o.logprobs, o.versions, o.finish_reason,
                       text=text, reward=rew, reward_parts=parts, task=run.items_by_uid[uid].task)
            fresh.setdefault(uid, []).append(s)
            by_uid.setdefault(uid, []).append(s)
            # the planner's rule for a solved prompt (so every replay it asks for has a response here);
            # a response is kept unless one with a higher reward is already banked
            banked = run.replay_bank.get(uid)
            if rew >= run.cfg.planner.success_threshold and (banked is None or rew >= banked["reward"]):
                run.replay_bank[uid] = {"ids": o.response_ids, "logprobs": o.logprobs, "reward": rew, "parts": parts}
        if out.adopted:
            planner.adopt(_group_results(fresh, out.adopted))
        return planner.observe(_group_results(fresh, out.groups)) if ask else []

    if hasattr(planner, "overlapped"):
        planner.overlapped = stream
    if hasattr(planner, "in_flight"):  # a carried group comes back through adopt(), not as a new request
        if hasattr(executor, "drop_stale"):
            executor.drop_stale()  # a group dropped as too old is not in flight: the planner may ask for it again
        planner.in_flight = set(getattr(executor, "carried", ()))
    requests = planner.begin_step(step)
    gen_s = 0.0  # engine time only: scoring and planning inside an overlapped round are taken out
    if stream:
        tg = time.perf_counter()
        executor.generate(requests, first_round=True, on_groups=lambda out: absorb(out, ask=bool(out.groups)))
        gen_s = time.perf_counter() - tg - cost["absorb_s"]
    else:
        first = True
        while requests or (first and executor.carried):
            tg = time.perf_counter()
            out = executor.generate(requests, first_round=first)
            gen_s += time.perf_counter() - tg
            first = False
            requests = absorb(out, ask=bool(requests))
    reward_s = cost["reward_s"]
    outcome = planner.end_step()
    if hasattr(executor, "step_dropped_tokens") and hasattr(planner, "charge_tokens"):
        planner.charge_tokens(executor.step_dropped_tokens())  # generated, never delivered: a token budget pays

    # which samples to train on: the planner's choice, plus stop-gradient replays
    batch: list[Sample] = []
    for g, uid in enumerate(outcome.train):
        for s in by_uid.get(uid, []):
            s.group_id = g
            batch.append(s)
        if uid in outcome.replay and uid in run.replay_bank:
            rb = run.replay_bank[uid]
            batch.append(Sample(uid, g, run.ids_by_uid[uid], rb["ids"], rb["logprobs"], [-1] * len(rb["ids"]), "stop",
                                reward=rb["reward"], reward_parts=rb["parts"], stop_gradient=True))
    tokens = executor.step_tokens()  # sampled this step: carried prefixes and reused tokens are not counted again
    generated = [s for ss in by_uid.values() for s in ss]
    return Produced(batch, generated, outcome, tokens, gen_s, reward_s, (issues[0], issues[1], issues[2]),
                    {**planner.metrics(), **executor.metrics()})


def overlong_punishment(length: int, cap: int, buffer: int, penalty: float) -> float:
    """DAPO's soft overlong punishment (reward.overlong_buffer): the reward lost by a response of `length`
    tokens, 0 up to cap - buffer, then growing linearly to `penalty` at the cap."""
    return penalty * min(max(length - (cap - buffer), 0), buffer) / buffer


def overlap_rounds(cfg: Config, executor: Any, planner: Any) -> bool:
    """Whether follow-up rounds join the running engine round (rollout.overlap_rounds). Unset: where
    possible and where the planner can ask for follow-ups at all (otherwise there is nothing to
    overlap, and scoring group by group inside the engine's loop would only add round trips)."""
    setting = cfg.rollout.overlap_rounds
    possible = bool(getattr(executor, "streams", False)) and bool(getattr(planner, "streams", False))
    if setting and not possible:  # the config's checks catch the built-in parts at start
        raise ValueError("rollout.overlap_rounds=true: this planner or executor cannot take groups one by one; "
                         "leave rollout.overlap_rounds unset")
    return possible and (bool(setting) or (setting is None and bool(getattr(planner, "follows_up", True))))


def budget_span(run: Run, p: Produced) -> tuple[float, float] | None:
    """The fractions of train.max_rollout_tokens spent before and after batch `p` was generated
    (None without a token budget): the learning-rate schedule decays over whichever of
    train.max_steps and the token budget ends the run first."""
    cap = run.cfg.train.max_rollout_tokens
    if cap is None:
        return None
    return run.totals["tokens"] / cap, (run.totals["tokens"] + p.tokens) / cap


def step_metrics(run: Run, p: Produced, metrics: dict[str, float]) -> dict[str, float]:
    """Add one step's rollout, reward and time metrics to the trainer's."""
    run.totals["rollouts"] += len(p.generated)
    run.totals["tokens"] += p.tokens
    # a step that trains nothing (every group discarded, say all correct) reports what it generated, not 0
    trained = [s for s in p.batch if not s.stop_gradient] or p.generated
    metrics.update(p.executor_metrics)
    metrics.update({
        "rollout/reward_mean": _mean([s.reward for s in trained]),
        "rollout/accuracy": _mean([float(is_correct(s.reward_parts, run.primary)) for s in trained]),
        "rollout/response_len_mean": _mean([s.num_response_tokens for s in p.generated]),
        "rollout/truncated_frac": _mean([float(s.finish_reason == "length") for s in p.generated]),
        "rollout/success_not_correct_frac": success_not_correct(p.generated, run.cfg.planner.success_threshold,
                                                                run.primary),
        "rollout/rollouts": float(len(p.generated)),
        "rollout/tokens": float(p.tokens),
        "rollout/rollouts_total": float(run.totals["rollouts"]),
        "rollout/tokens_total": float(run.totals["tokens"]),
        "rollout/tokens_per_s": p.tokens / p.gen_s if p.gen_s else 0.0,
        "rollout/groups": group_outcomes(p.generated, run.primary),
        "reward/errors": float(p.reward_issues[0]), "reward/timeouts": float(p.reward_issues[1]),
        "reward/nans": float(p.reward_issues[2]),
        "time/generate_s": p.gen_s, "time/reward_s": p.reward_s,
    })
    return metrics


def group_outcomes(generated: list[Sample], primary: str) -> list[list]:
    """[uid, outcomes, lengths] of every prompt rolled out this step (discarded groups included),
    outcomes a string of 1 (correct) and 0 in the order the samples were requested (a probe before
    its top-up; within a round not in the order they finished, which puts short answers first), lengths their response token counts in the same order: what `rollwise simulate
    --fit` fits a simulated world to, and what shows whether correct answers are the shorter ones."""
    out: dict[str, list] = {}
    for s in generated:
        g = out.setdefault(s.prompt_uid, [s.prompt_uid, "", []])
        g[1] += "1" if is_correct(s.reward_parts, primary) else "0"
        g[2].append(s.num_response_tokens)
    return list(out.values())


def report_step(run: Run, step: int, p: Produced, metrics: dict[str, float], progress: StepProgress) -> None:
    run.tracker.log(step, metrics)
    run.result.history.append({"step": step, **metrics})
    for note in p.outcome.notes:
        progress.note(f"step {step}: {note}")
    if any(p.reward_issues):
        e, t, n = p.reward_issues
        progress.note(f"step {step}: reward errors={e} timeouts={t} nans={n} (scored 0)")
    progress.update(step, metrics)


def is_last_step(run: Run, step: int) -> bool:
    """After `step` updates: max_steps reached or the rollout token budget spent."""
    return step == run.cfg.train.max_steps or token_budget_spent(run.cfg, run.totals["tokens"])


def is_eval_step(cfg: Config, step: int) -> bool:
    """An evaluation during training after `step` updates (eval.every_n_steps)."""
    return bool(cfg.eval.every_n_steps and step % cfg.eval.every_n_steps == 0)


def fit_replay_bank(bank: dict[str, dict[str, Any]], planner: Any, cfg: Config,
                    changes: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """The checkpoint's replay bank under the settings a resume changed: responses scored under other
    reward settings (any reward.* changed) are dropped, and those below a raised planner.success_threshold;
    the replay part forgets that their prompts were solved. Unchanged settings keep the bank whole."""
    # the length cap is part of the reward where reward.overlong_buffer or reward.truncated_reward reads it
    rescored = any(k.startswith("reward.") for k in changes) or ("rollout.max_completion_length" in changes and (
        bool(cfg.reward.overlong_buffer) or cfg.reward.truncated_reward is not None))
    if rescored:
        keep: dict[str, dict[str, Any]] = {}
    else:
        keep = {u: b for u, b in bank.items() if b["reward"] >= cfg.planner.success_threshold}
    dropped = [u for u in bank if u not in keep]
    solved = getattr(getattr(planner, "repair", None), "has_correct", None)
    if dropped and solved is not None:
        solved[[planner.index[u] for u in dropped if u in planner.index]] = False
    if dropped:
        why = "the reward settings changed" if rescored else "they score below planner.success_threshold"
        print(f"rollwise: the resume drops {len(dropped)} of the replay bank's {len(bank)} responses ({why}); "
              "their prompts count as unsolved until solved again", file=sys.stderr)
    return keep


def is_checkpoint_step(cfg: Config, step: int) -> bool:
    return step == cfg.train.max_steps or bool(cfg.run.save_every and step % cfg.run.save_every == 0)


def loop_state(run: Run, rollout_state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's `extra`: planner, replay bank (and the settings it was scored under), totals
    and best evaluation, the training set's digest, plus the rollout side's state."""
    return {"planner": run.planner.state_dict(), "replay_bank": run.replay_bank, "totals": run.totals,
            "best": run.best.state_dict(), "data": data_digest(run), "bank_scored_under": bank_settings(run.cfg),
            **rollout_state}


def bank_settings(cfg: Config) -> dict[str, Any]:
    """The settings the replay bank's rewards depend on: every reward.* and the length cap (which
    reward.overlong_buffer and reward.truncated_reward read), recorded in checkpoints and compared on resume."""
    return {**{f"reward.{k}": v for k, v in config_to_dict(cfg)["reward"].items()},
            "rollout.max_completion_length": cfg.rollout.max_completion_length}


def data_digest(run: Run) -> str:
    """A digest of the training prompts in the planner's order and the held-out items: a resume must
    rebuild the same ones (the planner's belief and the data position point at them by index)."""
    import hashlib

    h = hashlib.sha256()
    for it in [*(run.items_by_uid[u] for u in run.ids_by_uid), *run.eval_items]:
        h.update(f"{it.uid}\x1f{it.question}\x1f{it.answer}\x1e".encode())
    return h.hexdigest()[:16]


def save(run: Run, step: int, rollout_state: dict[str, Any]) -> None:
    """Checkpoint the trainer (in this process) with the loop's state."""
    save_checkpoint(run.run_dir, step, run.model, run.trainer.state_dict(), loop_state(run, rollout_state),
                    run.cfg.run.keep_checkpoints)


def say_budget_stop(cfg: Config, last_step: int, tokens: float) -> None:
    """When train.max_rollout_tokens ended the run before train.max_steps, say so on stderr (the
    progress bar stops short of its total otherwise without a word). The config check of
    train.lr_scheduler knows updates, not tokens, so a budget spent within the warm-up is warned
    about here too."""
    t = cfg.train
    if not token_budget_spent(cfg, tokens) or last_step >= t.max_steps:
        return
    print(f"rollwise: step {last_step}: the rollout-token budget is spent ({tokens:,.0f} tokens generated, "
          f"train.max_rollout_tokens={t.max_rollout_tokens}); the run stops before train.max_steps={t.max_steps}",
          file=sys.stderr)
    updates = last_step * cfg.algo.num_iterations
    if t.lr_scheduler != "constant" and updates <= t.warmup_steps + 1:  # the first update after warm-up is at full rate
        print(f"rollwise: warning: the rollout-token budget (train.max_rollout_tokens={t.max_rollout_tokens}) ended "
              f"the run after {updates} optimizer updates, within the warm-up of train.warmup_steps={t.warmup_steps}: "
              f"train.lr_scheduler={t.lr_scheduler} never decayed the learning rate; lower train.warmup_steps or "
              "raise the budget", file=sys.stderr)


def finish(run: Run, last_step: int, quiet: bool) -> RunResult:
    try:
        if last_step > run.start_step:  # a resumed run that trained nothing has said why already
            say_budget_stop(run.cfg, last_step, run.totals["tokens"])
        if final_eval_due(run, last_step):  # the async loop's own final evaluation is reused
            run.result.eval_after = final_eval(run, last_step)
        run.tracker.close()
    except BaseException:  # the async loop calls this after its own clean-up: the writer thread and worker stop here
        close_on_failure(run)
        raise
    run.runner.close()
    if not quiet:
        print_summary(run.run_dir)
    return run.result


def close_on_failure(run: Run) -> None:
    """A run stopped by an error or Ctrl-C: its progress bar, TensorBoard's writer thread and the reward worker stop,
    so a caller that goes on (a notebook, a script that catches the error) keeps none of them running (and a
    terminal gets its cursor back). Its checkpoints stay."""
    for part in ("progress", "tracker", "runner"):
        with contextlib.suppress(Exception):  # the error that stopped the run is the one raised, not this one's
            getattr(run, part).close()


def train(cfg: Config, resume: str | None = None, quiet: bool = False) -> RunResult:
    if cfg.distributed.async_training or cfg.distributed.backend == "ray":
        from rollwise.distributed.async_loop import train_async

        return train_async(cfg, resume, quiet)
    run = setup(cfg, resume, log_start=False)  # logged in train_sync: the engine's state and first weights are part of the start
    try:
        return train_sync(run, quiet)
    except BaseException:
        close_on_failure(run)
        raise


def train_sync(run: Run, quiet: bool) -> RunResult:
    """The synchronous loop, top to bottom, on a run `setup` made."""
    cfg = run.cfg
    ro = cfg.rollout
    engine = run.engine
    executor = RolloutExecutor(engine, run.ids_by_uid, ro.max_completion_length, ro.temperature,
                               partial=ro.partial_rollouts, retention_limit=ro.retention_limit,
                               speculative=ro.speculative_reuse, lenience=ro.spec_lenience,
                               stop_fraction=ro.partial_stop_fraction, keep_kv=ro.partial_keep_kv)
    if run.state is not None:
        engine.load_state_dict(run.state["extra"]["engine"])
        if "executor" in run.state["extra"]:
            executor.load_state_dict(run.state["extra"]["executor"])
    stream = overlap_rounds(cfg, executor, run.planner)
    engine.load_weights(merged_state_dict(run.model), version=run.start_step)
    log_setup(run)
    if run.start_step == 0 and cfg.eval.at_start:
        run.result.eval_before = run_eval(run, 0)

    # ---- the loop: plan -> generate -> reward -> advantages -> update -> new weights to the engine
    progress = run.progress = StepProgress(cfg.train.max_steps, run.start_step, enabled=cfg.run.progress and not quiet)
    last_step = run.start_step
    for step in steps_to_train(run, progress):
        t0 = time.perf_counter()
        produced = produce_batch(run, step, executor, stream)

        tt = time.perf_counter()
        metrics: dict[str, float] = run.trainer.compute_advantages(produced.batch)
        metrics.update(run.trainer.update(produced.batch, budget_span(run, produced)))
        engine.load_weights(merged_state_dict(run.model), version=step + 1)
        metrics["time/train_s"] = time.perf_counter() - tt

        step_metrics(run, produced, metrics)
        metrics["time/step_s"] = time.perf_counter() - t0
        report_step(run, step + 1, produced, metrics, progress)

        # evaluation and checkpoints
        done = is_last_step(run, step + 1)
        if is_eval_step(cfg, step + 1) and not (done and cfg.eval.at_end):  # at the last step the final one does
            progress.update(step + 1, {**metrics, **run_eval(run, step + 1)})
            # a run at its last step (train.max_steps, the token budget) has finished: not an early stop
            done = done or stopped_early(run, step + 1, progress)
        if done or is_checkpoint_step(cfg, step + 1):
            save(run, step + 1, {"engine": engine.state_dict(), "executor": executor.state_dict()})
        if done:
            last_step = step + 1
            break
    progress.close()
    return finish(run, last_step, quiet)


def _group_results(samples: dict[str, list[Sample]], uids: Any) -> list[GroupResult]:
    return [GroupResult(u, [s.reward for s in samples[u]], [s.num_response_tokens for s in samples[u]]) for u in uids]


def _mean(xs: list[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else 0.0


def _as_list(x: Any) -> list[Any]:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


__all__ = ["Run", "RunResult", "train", "load_resumed_config", "PromptItem"]
