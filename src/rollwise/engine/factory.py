"""Build the configured engine; the synchronous loop and every rollout worker use this one function."""

from __future__ import annotations

from typing import Any

import torch

from rollwise.config import Config, ConfigError
from rollwise.engine.continuous import ContinuousEngine
from rollwise.engine.hf import HFEngine
from rollwise.models import DTYPES, compute_dtype


def engine_dtype(cfg: Config) -> torch.dtype:
    # Speculative reuse runs the engine in fp32: in bf16, decoding and the one-pass verification round
    # differently and a third of the tokens were rejected with the weights unchanged
    # (bench/spec_same_weights.py). rollout.engine_dtype overrides the choice.
    if cfg.rollout.engine_dtype != "auto":
        return DTYPES[cfg.rollout.engine_dtype]
    return torch.float32 if cfg.rollout.speculative_reuse else compute_dtype(cfg.model.dtype, cfg.model.device)


def max_new_tokens(cfg: Config) -> int:
    """The most new tokens the engine is asked for in one sequence: training's samples
    (rollout.max_completion_length) or evaluation's during training (eval.max_completion_length)."""
    return max(cfg.rollout.max_completion_length, cfg.eval.max_completion_length or 0)


# model types whose positions are a learned table (wpe / embed_positions): a longer sequence indexes past it
_LEARNED_POSITIONS = {"gpt2", "gpt_bigcode", "gpt_neo", "opt", "biogpt", "xglm", "imagegpt", "decision_transformer"}


def _text_config(model_config: Any) -> Any:
    get = getattr(model_config, "get_text_config", None)
    return get() if callable(get) else model_config


def context_length(model_config: Any) -> tuple[int, str] | None:
    """The model's trained context length and the config field that gives it; None when the config says none."""
    c = _text_config(model_config)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"):
        value = getattr(c, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return _rope_scaled(c, value, name)
    return None


def _rope_scaled(c: Any, value: int, name: str) -> tuple[int, str]:
    """A config that stretches its rotary positions (yarn, linear, dynamic) but keeps the original length in
    max_position_embeddings (Qwen2.5's documented YaRN setting) reaches original x factor, as vLLM counts it."""
    rope = getattr(c, "rope_scaling", None) or getattr(c, "rope_parameters", None)
    if not isinstance(rope, dict):
        return value, name
    kind = rope.get("rope_type") or rope.get("type")
    factor, original = rope.get("factor"), rope.get("original_max_position_embeddings")
    if (kind in ("yarn", "linear", "dynamic") and isinstance(factor, (int, float)) and factor > 1
            and isinstance(original, int) and value <= original):
        return int(original * factor), f"{name} with rope_scaling {kind} x{factor:g}"
    return value, name


def learned_position_embeddings(model_config: Any) -> bool:
    """True when the model's positions are a learned table (GPT-2 style): a sequence longer than it
    fails mid-run (IndexError); rotary and ALiBi models generate past it, silently off their training."""
    c = _text_config(model_config)
    if getattr(c, "model_type", None) in _LEARNED_POSITIONS:
        return True
    d = c.to_dict() if hasattr(c, "to_dict") else vars(c)
    return "n_positions" in d and not d.get("rotary_dim") and not d.get("rotary_pct") and not d.get("alibi")


def context_length_problem(model_config: Any, max_prompt: int, max_new: int) -> str | None:
    """A message when a prompt of `max_prompt` tokens plus `max_new` new tokens does not fit the model's
    context length (config.max_position_embeddings or n_positions); None when it fits or the config gives none."""
    found = context_length(model_config)
    if found is None:
        return None
    limit, name = found
    total = max_prompt + max_new
    if total <= limit:
        return None
    return (f"data.max_prompt_length ({max_prompt}) + the most new tokens asked for ({max_new}: the larger of "
            f"rollout.max_completion_length and eval.max_completion_length) = {total} tokens exceeds the model's "
            f"context length ({limit}, its config's {name}) by {total - limit}; lower data.max_prompt_length, "
            "rollout.max_completion_length or eval.max_completion_length so that they add up to at most "
            f"{limit}")


def check_context_length(model_config: Any, cfg: Config) -> str | None:
    """At setup: ConfigError when data.max_prompt_length plus the most new tokens asked for does not fit a model
    with learned position embeddings (it would fail mid-run); the message as a warning for other models (they
    generate past their trained context, off their training); None when it fits."""
    return refuse_or_warn(model_config, context_length_problem(model_config, cfg.data.max_prompt_length,
                                                               max_new_tokens(cfg)))


def refuse_or_warn(model_config: Any, problem: str | None) -> str | None:
    """A context-length `problem` as a ConfigError for a model with learned positions (longer sequences fail
    mid-run), as the warning to print for other models (they generate past their trained context), None without."""
    if problem is not None and learned_position_embeddings(model_config):
        raise ConfigError(f"{problem} (this model's positions are a learned table: longer sequences fail mid-run)")
    if problem is not None:
        return f"{problem} (past it this model generates off its training)"
    return None


def build_engine(cfg: Config, model: torch.nn.Module, eos_ids: list[int], pad_id: int, seed: int,
                 model_path: str | None = None) -> HFEngine:
    """The engine keeps its own copy of `model` in the compute dtype (build it before LoRA is applied);
    vLLM loads `model_path` itself and receives the trainer's weights through `load_weights`."""
    ro = cfg.rollout
    if ro.engine == "vllm":
        from rollwise.engine.vllm import VLLMEngine

        if model_path is None:
            raise ValueError("rollout.engine=vllm needs the model's folder")
        return VLLMEngine(model_path, eos_ids, pad_id, engine_dtype(cfg), ro.top_p, ro.top_k, seed,  # type: ignore[return-value]
                          ro.vllm_gpu_memory_utilization, cfg.data.max_prompt_length + max_new_tokens(cfg))
    args = (model, eos_ids, pad_id, engine_dtype(cfg), ro.batch_size, ro.top_p, ro.top_k, seed)
    if ro.engine == "continuous":
        return ContinuousEngine(*args, num_slots=ro.num_slots, record_topk=ro.spec_topk if ro.speculative_reuse else 0,
                                transpose_weights=ro.transpose_weights)
    return HFEngine(*args, transpose_weights=ro.transpose_weights)
