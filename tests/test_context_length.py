"""The engine's context: vLLM's max_model_len covers evaluation's answers, and a prompt plus the most new
tokens asked for is checked against the model's context length (pure functions, no model built)."""

import sys
import types

import pytest
from transformers import CodeGenConfig, GPT2Config, LlamaConfig, OPTConfig, Qwen2Config

from rollwise.config import build_config
from rollwise.engine.factory import (
    build_engine,
    context_length,
    context_length_problem,
    learned_position_embeddings,
    max_new_tokens,
)


def _vllm_args(monkeypatch, overrides):
    got = {}
    fake = types.ModuleType("rollwise.engine.vllm")

    class VLLMEngine:
        def __init__(self, *args):
            got["args"] = args

    fake.VLLMEngine = VLLMEngine
    monkeypatch.setitem(sys.modules, "rollwise.engine.vllm", fake)
    build_engine(build_config(overrides), None, [2], 0, seed=3, model_path="some/model")
    return got["args"]


@pytest.mark.parametrize("eval_cap, expect", [(None, 160), (40, 160), (200, 260)])
def test_vllm_max_model_len_covers_evaluations_longer_answers(monkeypatch, eval_cap, expect):
    """Evaluation during training asks the engine for eval.max_completion_length new tokens: vLLM's
    max_model_len must hold them, or longer answers are cut there silently."""
    cfg = {"rollout": {"engine": "vllm", "max_completion_length": 100}, "data": {"max_prompt_length": 60}}
    if eval_cap is not None:
        cfg["eval"] = {"max_completion_length": eval_cap}
    assert _vllm_args(monkeypatch, cfg)[-1] == expect
    assert max_new_tokens(build_config(cfg)) == expect - 60


def test_context_length_problem_names_what_exceeds_what_and_what_to_lower():
    gpt2 = GPT2Config(n_positions=64)
    assert context_length(gpt2) == (64, "max_position_embeddings")
    assert context_length_problem(gpt2, 40, 24) is None  # exactly fits
    msg = context_length_problem(gpt2, 40, 25)
    assert msg is not None
    for part in ("data.max_prompt_length (40)", "(25:", "= 65 tokens", "context length (64", "by 1",
                 "rollout.max_completion_length", "eval.max_completion_length", "at most 64"):
        assert part in msg, (part, msg)
    llama = LlamaConfig(max_position_embeddings=512)
    assert context_length_problem(llama, 256, 256) is None
    assert "context length (512" in context_length_problem(llama, 256, 257)


def test_context_length_follows_yarn_scaling_and_a_config_without_one_passes():
    yarn = Qwen2Config(max_position_embeddings=32768,
                       rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert context_length(yarn)[0] == 131072
    assert context_length_problem(yarn, 1024, 60000) is None
    assert context_length_problem(Qwen2Config(max_position_embeddings=32768), 1024, 60000) is not None
    assert context_length_problem(types.SimpleNamespace(), 10**6, 10**6) is None


def test_learned_position_embeddings_tell_a_crash_from_a_silent_overrun():
    assert learned_position_embeddings(GPT2Config())
    assert learned_position_embeddings(OPTConfig())
    assert not learned_position_embeddings(LlamaConfig())
    assert not learned_position_embeddings(CodeGenConfig())  # n_positions, but rotary


def test_a_gpt2_past_its_positions_fails_as_the_check_says():
    """The case the check exists for: a GPT-2 asked for more positions than it has fails mid-generation."""
    import torch
    from transformers import GPT2LMHeadModel

    cfg = GPT2Config(n_positions=8, n_embd=16, n_layer=1, n_head=2, vocab_size=32)
    model = GPT2LMHeadModel(cfg).eval()
    assert context_length_problem(cfg, 4, 5) is not None
    with pytest.raises((IndexError, RuntimeError)), torch.no_grad():
        model(torch.zeros((1, 9), dtype=torch.long))


def test_check_context_length_refuses_learned_positions_and_warns_otherwise():
    from rollwise.config import ConfigError
    from rollwise.engine.factory import check_context_length

    cfg = build_config({"rollout": {"max_completion_length": 100}, "data": {"max_prompt_length": 60},
                        "eval": {"max_completion_length": 500}})
    assert check_context_length(GPT2Config(n_positions=1024), cfg) is None
    with pytest.raises(ConfigError, match=r"= 560 tokens exceeds the model's context length \(512.*learned table"):
        check_context_length(GPT2Config(n_positions=512), cfg)
    warning = check_context_length(LlamaConfig(max_position_embeddings=512), cfg)
    assert warning is not None and "eval.max_completion_length" in warning and "off its training" in warning
