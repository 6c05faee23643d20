"""Build the configured engine; the synchronous loop and every rollout worker use this one function."""

from __future__ import annotations

import torch

from rollwise.config import Config
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
                          ro.vllm_gpu_memory_utilization, cfg.data.max_prompt_length + ro.max_completion_length)
    args = (model, eos_ids, pad_id, engine_dtype(cfg), ro.batch_size, ro.top_p, ro.top_k, seed)
    if ro.engine == "continuous":
        return ContinuousEngine(*args, num_slots=ro.num_slots, record_topk=ro.spec_topk if ro.speculative_reuse else 0,
                                transpose_weights=ro.transpose_weights)
    return HFEngine(*args, transpose_weights=ro.transpose_weights)
