"""`rollwise eval`: score a model, a run folder (its last checkpoint) or a checkpoint."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rollwise.config import (
    Config,
    ConfigError,
    _merge,
    build_config,
    config_to_dict,
    leaves,
    load_config,
    parse_overrides,
    read_config_file,
    read_run_config,
)

# rollout settings `rollwise eval` does not read: it always generates with an HFEngine of eval.batch_size
_EVAL_UNREAD = ("rollout.engine", "rollout.batch_size", "rollout.num_slots")
# settings of training alone: `rollwise eval` reads data, reward, model, eval.batch_size / max_completion_length /
# pass_k, rollout's sampling settings, run.seed and run.torch_threads
_TRAINING_ONLY = ("train.", "algo.", "planner.", "distributed.", "run.progress", "run.save_every", "run.keep_checkpoints",
                  "run.tensorboard",
                  "eval.every_n_steps", "eval.at_start", "eval.at_end", "eval.save_best", "eval.early_stopping",
                  "rollout.prompts_per_step", "rollout.num_generations", "rollout.partial_", "rollout.overlap_rounds",
                  "rollout.retention_limit", "rollout.spec", "rollout.vllm_", "reward.truncated_reward", "reward.overlong_")


def _target_config(target: str | None, items: list[str], command: str = "eval") -> tuple[Config, Path | None]:
    """The config and checkpoint that `rollwise eval` (or, with command="export", `rollwise export`) works on:
    a run folder's last checkpoint, a checkpoint folder, or else a model named by `target`."""
    from rollwise.cli import _split_args
    from rollwise.loop import FIXED_ON_RESUME
    from rollwise.models import looks_local
    from rollwise.training.checkpoint import latest_checkpoint

    config, overrides = _split_args(items)
    if target and (target.endswith((".yaml", ".yml")) or ("=" in target and not Path(target).exists())):  # runs/lr=1e-5
        config, overrides = _split_args([target, *items])
        target = None
    given = leaves(parse_overrides(overrides)) if command == "eval" else {}
    unread = [k for k in given if k in _EVAL_UNREAD]
    if unread:
        print(f"rollwise: warning: {', '.join(unread)} has no effect here: `rollwise eval` generates with the hf "
              "engine, eval.batch_size sequences at a time (set eval.batch_size instead)", file=sys.stderr)
    training = [k for k in given if k.startswith(_TRAINING_ONLY)]
    if training:
        print(f"rollwise: warning: {', '.join(training)} has no effect here: it is a setting of training, and "
              "`rollwise eval` trains nothing", file=sys.stderr)
    naming = [k for k in given if k in ("run.name", "run.output_dir")]
    if naming:  # `rollwise eval run.name=NAME` evaluated the base model without a word
        print(f"rollwise: warning: {', '.join(naming)} has no effect here: `rollwise eval` evaluates "
              f"{target or 'model.name_or_path'}, not a run named by these; to evaluate a run give its folder: "
              "`rollwise eval RUN_OUTPUT_DIR/RUN_NAME`", file=sys.stderr)
    ckpt = None
    if target:
        t = Path(target)
        run_dir = run_dir_of(t)
        if (run_dir / "config.yaml").is_file():  # the run's config, then a CONFIG.yaml given here, then overrides
            run_saved = saved = read_run_config(run_dir)
            if config:
                saved = _merge(saved, read_config_file(config))
            cfg = build_config(_merge(saved, parse_overrides(overrides)))
            # compared with the run's own config.yaml, not with it merged with the CONFIG.yaml given here
            was, now = leaves(run_saved), leaves(config_to_dict(cfg))
            fixed = tuple(k for k in FIXED_ON_RESUME if k.startswith("model."))  # what the weights belong to
            moved = [k for k in was if k.startswith(fixed) and not _same_setting(k, was[k], now.get(k))]
            if moved:
                raise ConfigError(f"rollwise eval {target}: {moved[0]} cannot differ from the run's ({was[moved[0]]} -> "
                                  f"{now.get(moved[0])}): the checkpoint's weights belong to that model. Leave it out "
                                  "of the CONFIG.yaml or overrides given here")
            ckpt = t if (t / "weights.safetensors").is_file() else latest_checkpoint(run_dir)
            if ckpt is None:
                raise FileNotFoundError(no_checkpoint_message(run_dir, command))
            return cfg, ckpt
        # a run folder without its config.yaml (or a checkpoint folder in one): read as a model folder, the error
        # said to run this very command, or to put the checkpoint back under the run folder it was in
        run_of = t.parent.parent if (t / "weights.safetensors").is_file() and t.parent.name == "checkpoints" else t
        if run_of.is_dir() and not (run_of / "config.json").is_file() \
                and any((run_of / n).exists() for n in ("checkpoints", "metrics.jsonl", "environment.json")):
            raise FileNotFoundError(f"run folder {run_of} has no config.yaml, so the base model and settings of its "
                                    "checkpoints are unknown: put back a copy of that file (a run stopped before "
                                    "writing it has no checkpoint: start it again)")
        if not t.exists() and looks_local(target):
            raise FileNotFoundError(f"'{target}' not found: give a run folder (runs/<name>), a checkpoint folder "
                                    "(runs/<name>/checkpoints/step_N) or a model folder")
        named = leaves(parse_overrides(overrides)).get("model.name_or_path")
        if named is not None and str(named) != target:  # the later one won silently: the model asked for was not read
            raise ConfigError(f"rollwise {command} {target} model.name_or_path={named}: two models; give the model once, "
                              "as the target or as model.name_or_path")
        overrides = [f"model.name_or_path={target}", *overrides]
    return load_config(config, overrides), ckpt


def _same_setting(key: str, a: Any, b: Any) -> bool:
    """Whether two values of a setting are the same; a local model folder is the same named by any path
    (config.yaml holds it absolute, a CONFIG.yaml given to eval may hold it relative)."""
    from rollwise.loop import same_folder

    local = key == "model.name_or_path" and all(isinstance(x, str) and Path(x).expanduser().exists() for x in (a, b))
    return a == b or (local and same_folder(a, b))  # a hub id is never a folder named the same


def run_dir_of(target: Path) -> Path:
    """The run folder of `target`: a checkpoint's (runs/NAME/checkpoints/step_N or best), or the folder itself."""
    return target.parent.parent if (target / "weights.safetensors").is_file() else target


def trained_questions(target: str | None, cfg: Config) -> set[str] | None:
    """The questions of the training items of the run that `target` belongs to, when `cfg` draws other held-out
    items than that run did (data.* or run.seed changed here): those may include questions it trained on. None
    when `target` is no run folder or checkpoint, or its held-out items are the run's own."""
    from rollwise.data import build_items

    if not target:
        return None
    run_dir = run_dir_of(Path(target))
    if not (run_dir / "config.yaml").is_file():
        return None
    run_cfg = build_config(read_run_config(run_dir))
    if run_cfg.data == cfg.data and run_cfg.run.seed == cfg.run.seed:
        return None  # the run's training set was drawn to avoid these very items
    try:
        train, _ = build_items(run_cfg.data, run_cfg.run.seed, empty_share=None)
    except (ConfigError, OSError, ValueError) as e:  # the run's data file moved away: its training questions are unknown here
        print(f"rollwise: warning: the run's training items could not be built ({str(e).splitlines()[0][:200]}), so "
              "held-out items it trained on are not left out", file=sys.stderr)
        return None
    return {it.question for it in train}


def no_checkpoint_message(run_dir: Path, command: str = "eval") -> str:
    """What `rollwise eval` or `rollwise export` says of a run folder with no step checkpoint."""
    from rollwise.ui import start_again_command
    best = Path(run_dir) / "checkpoints" / "best"
    has_best = (best / "weights.safetensors").is_file()
    if command != "export":
        return (f"run folder {run_dir} has no checkpoint to evaluate (the run stopped before its first one): rerun "
                "it, or evaluate its base model with `rollwise eval MODEL`"
                + (f", or the best weights it saved (eval.save_best): `rollwise eval {best}`" if has_best else ""))
    saved = f"; or export the best weights it saved (eval.save_best): `rollwise export {best} OUT_DIR`" if has_best else ""
    return (f"run folder {run_dir} has no checkpoint to export (the run stopped before its first one; run.save_every "
            f"sets how often they are written): start it again with {start_again_command(run_dir)} and export it once it has written "
            f"a checkpoint{saved}")


def eval_engine(cfg: Config, path: str, ckpt: Path | None, tok: Any) -> Any:
    """The engine `rollwise eval` generates with: the dtype and weight layout of the run's own engine,
    so that it reproduces the run's greedy eval/accuracy exactly in float32 (in bf16 another batching can
    change an answer whose top two tokens nearly tie: the run batched by rollout.num_slots, this by eval.batch_size). Sampled metrics (eval/pass@k) are a
    fresh draw: the samples depend on how requests are batched (eval.batch_size here, the rollout
    engine's slots in the run), so they match the run's only in expectation. Like the run's, it is built from the plain model
    before LoRA and given the merged weights (built after LoRA it would hold the adapter layers apart,
    and the merged weights would not reach them)."""
    from rollwise.engine import HFEngine
    from rollwise.engine.factory import engine_dtype
    from rollwise.loop import _as_list, load_policy
    from rollwise.models import apply_lora, merged_state_dict
    from rollwise.training.checkpoint import load_checkpoint_weights

    model = load_policy(cfg, path)  # fp32 on model.device
    eos = sorted({tok.eos_token_id, *_as_list(getattr(model.generation_config, "eos_token_id", None))} - {None})

    def build(m: Any) -> Any:
        return HFEngine(m, eos, tok.pad_token_id, engine_dtype(cfg), cfg.eval.batch_size, cfg.rollout.top_p,
                        cfg.rollout.top_k, cfg.run.seed, transpose_weights=cfg.rollout.transpose_weights)

    if ckpt is None or not cfg.model.lora.enabled:
        if ckpt is not None:
            load_checkpoint_weights(ckpt, model)
        return build(model)
    engine = build(model)  # its own copy, plain layout
    model = apply_lora(model, cfg.model)
    load_checkpoint_weights(ckpt, model)
    engine.load_weights(merged_state_dict(model), 0)
    return engine


def check_eval_context(path: str, longest_prompt: int, max_new: int) -> None:
    """Before generating: a ConfigError when the longest held-out prompt plus the new tokens asked for does not fit a
    model whose positions are a learned table (GPT-2: it failed mid-evaluation with an IndexError traceback); a
    warning for other models, which generate past their trained context off their training."""
    from transformers import AutoConfig

    from rollwise.engine.factory import context_length, refuse_or_warn

    model_config = AutoConfig.from_pretrained(path, local_files_only=Path(path).exists())
    found = context_length(model_config)
    if found is None or longest_prompt + max_new <= found[0]:
        return
    limit, name = found
    problem = (f"the longest held-out prompt ({longest_prompt} tokens) + the new tokens asked for ({max_new}: "
               f"eval.max_completion_length, else rollout.max_completion_length) = {longest_prompt + max_new} tokens "
               f"exceeds the model's context length ({limit}, its config's {name}); lower eval.max_completion_length "
               f"or data.max_prompt_length (longer prompts are left out) so that they add up to at most {limit}")
    warning = refuse_or_warn(model_config, problem)
    if warning:
        print(f"rollwise: warning: {warning}", file=sys.stderr)


def run_eval_command(args: argparse.Namespace) -> int:
    from rollwise.data import build_items, encode_prompts
    from rollwise.evaluate import evaluate
    from rollwise.loop import set_threads, warn_idle_gpu, warn_slow_dtype
    from rollwise.models import (
        load_tokenizer,
        resolve_model_path,
    )
    from rollwise.rewards import RewardRunner

    cfg, ckpt = _target_config(args.target, args.items)
    set_threads(cfg.run.torch_threads)
    warn_slow_dtype(cfg)
    warn_idle_gpu(cfg)
    runner = RewardRunner(cfg.reward)
    _, eval_items = build_items(cfg.data, cfg.run.seed, empty_share="eval")
    path = resolve_model_path(cfg.model.name_or_path, cfg.model.cache_dir)
    tok = load_tokenizer(path)
    ids, dropped = encode_prompts(eval_items, tok, cfg.data)
    keep = [i for i, it in enumerate(eval_items) if it.uid not in set(dropped)]
    asked = trained_questions(args.target, cfg) or set()
    # data.* or run.seed changed here: the held-out items may hold questions the run trained on
    seen = [i for i in keep if eval_items[i].question in asked]
    keep = [i for i in keep if eval_items[i].question not in asked]
    if not keep:
        raise ConfigError(f"no held-out items to evaluate: {len(eval_items)} drawn (data.eval_size="
                          f"{cfg.data.eval_size}), {len(dropped)} of them longer than data.max_prompt_length="
                          f"{cfg.data.max_prompt_length} tokens" + (f", {len(seen)} asking a question the run trained "
                                                                   "on" if seen else "")
                          + "; raise data.eval_size or data.max_prompt_length")
    if seen:
        print(f"rollwise: {len(seen)} of the {len(eval_items)} held-out items ask a question the run trained on "
              "(data.* or run.seed differ from the run's, so its training set did not avoid them) and are left out",
              file=sys.stderr)
    if dropped:
        print(f"rollwise: {len(dropped)} of {len(eval_items)} held-out items are longer than data.max_prompt_length="
              f"{cfg.data.max_prompt_length} tokens and are left out", file=sys.stderr)
    max_new = cfg.eval.max_completion_length or cfg.rollout.max_completion_length
    check_eval_context(path, max(len(ids[i]) for i in keep), max_new)
    engine = eval_engine(cfg, path, ckpt, tok)
    m = evaluate(engine, [eval_items[i] for i in keep], [ids[i] for i in keep], runner, cfg.reward.functions[0].name,
                 tok, cfg.eval.max_completion_length or cfg.rollout.max_completion_length, cfg.eval.pass_k,
                 cfg.rollout.temperature, cfg.run.seed)
    runner.close()
    table = Table(title=escape(f"eval: {ckpt or cfg.model.name_or_path}"))
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in m.items():
        table.add_row(k, str(int(v)) if k in ("eval/items", "eval/reward_failures") else f"{v:.4f}" if isinstance(v, float) else escape(str(v)))
    Console().print(table)
    return 0
