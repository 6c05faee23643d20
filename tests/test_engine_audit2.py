"""Second audit of the generation engines and the rollout executor: each defect found, with its test."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from rollwise.engine import GenerationOutput, GenerationRequest, HFEngine
from rollwise.engine.continuous import ContinuousEngine
from rollwise.engine.executor import RolloutExecutor
from rollwise.models import load_model, load_tokenizer
from rollwise.planner.base import Request


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir)), load_model(str(tiny_model_dir))


def _engines(tiny):
    tok, model = tiny
    return [cls(model, [tok.eos_token_id], tok.pad_token_id, dtype=torch.float32, batch_size=2, seed=0)
            for cls in (HFEngine, ContinuousEngine)]


def test_hf_engine_outputs_carry_their_requests_ids(tiny):
    """The engine protocol matches outputs to requests by request_id: the continuous and vLLM engines'
    generate() hand each request's id back; the hf engine returned None for every one."""
    for eng in _engines(tiny):
        outs = eng.generate([GenerationRequest([5, 6, 7], 3, request_id=7), GenerationRequest([8], 2, request_id=3),
                             GenerationRequest([9, 9], 2)])
        assert [o.request_id for o in outs] == [7, 3, None], type(eng).__name__


def test_hf_engine_gives_no_tokens_to_requests_for_none_or_fewer(tiny):
    """A request for 0 (or fewer) new tokens gets none. The continuous engine did so; the hf engine did
    beside a longer request, but failed alone with 'zeros: Dimension size must be non-negative'."""
    for eng in _engines(tiny):
        for reqs in ([GenerationRequest([5, 6], -1)], [GenerationRequest([5, 6], -2), GenerationRequest([7], 0)]):
            outs = eng.generate(reqs)
            assert [(o.response_ids, o.finish_reason) for o in outs] == [([], "length")] * len(reqs), type(eng).__name__


def test_a_token_id_outside_the_models_vocabulary_is_a_clear_error(tiny):
    """A prompt holding a token id the model has no embedding for (a tokenizer with added tokens the model
    was not resized for) failed deep inside the model: 'IndexError: index out of range in self' on a
    CPU, a device-side assert that poisons the CUDA context on a GPU. Each engine names the id and the
    vocabulary size instead, before running the model."""
    tok, model = tiny
    vocab = model.get_input_embeddings().num_embeddings
    for eng in _engines(tiny):
        with pytest.raises(ValueError, match=rf"token id {vocab}\b.*{vocab} tokens"):
            eng.generate([GenerationRequest([5, 6], 3), GenerationRequest([5, vocab], 3)])
        with pytest.raises(ValueError, match="token id -1"):
            eng.generate([GenerationRequest([-1, 5], 3)])
    cont = _engines(tiny)[1]
    with pytest.raises(ValueError, match=rf"token id {vocab + 3}\b"):  # a resumed prefix is context too
        cont.generate([GenerationRequest([5], 4, prefix_ids=[vocab + 3], prefix_logprobs=[-1.0], prefix_versions=[0])])
    with pytest.raises(ValueError, match=rf"token id {vocab}\b"):
        cont.verify([[5, vocab]], [GenerationOutput([6], [-1.0], [0], "length")], 1.0, 1.0, 4)


def test_a_carried_sample_keeps_its_requests_own_lower_cap_on_resume():
    """A planner Request may set its own max_new_tokens (fresh samples and reused responses honour it).
    On resume, carried samples were all given the run's rollout.max_completion_length: a sample asked
    for 5 tokens continued to 40. A request's own cap is kept (lowered to the run's cap if that is lower);
    samples under the run's cap take the new run's cap, as before."""

    class Cutter:
        version = 0

        def run_round(self, reqs, stop_when=None, token_budget=None, hold=False, feed=None, generator=None):
            return [], [replace(q, prefix_ids=[7] * 3, prefix_logprobs=[-0.1] * 3, prefix_versions=[0] * 3)
                        for q in reqs]

    ex = RolloutExecutor(Cutter(), {"a": [1], "b": [2]}, 16, 1.0, partial=True)
    ex.generate([Request("a", 2, max_new_tokens=5), Request("b", 2), Request("a", 1, max_new_tokens=30)])
    assert sorted(q.max_new_tokens for g in ex.carried.values() for q in g.pending) == [5, 5, 16, 16, 30]
    for cap, want in ((40, [5, 5, 30, 40, 40]), (8, [5, 5, 8, 8, 8]), (16, [5, 5, 16, 16, 16])):
        resumed = RolloutExecutor(Cutter(), {"a": [1], "b": [2]}, cap, 1.0, partial=True)
        resumed.load_state_dict(copy.deepcopy(ex.state_dict()))
        assert sorted(q.max_new_tokens for g in resumed.carried.values() for q in g.pending) == want, cap


def test_a_pad_token_outside_the_models_vocabulary_is_refused_when_the_engine_is_built(tiny):
    """A tokenizer whose pad_token was added without resizing the model (a common Llama-2 recipe) gave a
    pad id past the embeddings: the first batch of prompts of unequal lengths failed mid-run with
    'index out of range in self' (a device-side assert on a GPU). The engine refuses it when built."""
    tok, model = tiny
    vocab = model.get_input_embeddings().num_embeddings
    for cls in (HFEngine, ContinuousEngine):
        with pytest.raises(ValueError, match=rf"pad token id {vocab}\b.*vocabulary of {vocab} tokens"):
            cls(model, [tok.eos_token_id], vocab, dtype=torch.float32)
