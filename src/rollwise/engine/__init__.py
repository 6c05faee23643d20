"""Generation engines. `hf` (transformers, CPU and GPU) is always available."""

from rollwise.engine.hf import GenerationOutput, GenerationRequest, HFEngine

__all__ = ["GenerationOutput", "GenerationRequest", "HFEngine"]
