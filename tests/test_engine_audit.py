"""Audit of the generation engines and the rollout executor: defects found, each with its test."""

from __future__ import annotations

import torch

from rollwise.engine.continuous import ContinuousEngine
from rollwise.engine.executor import RolloutExecutor
from rollwise.models import load_model, load_tokenizer
from rollwise.planner.base import Request


def test_speculative_reuse_keeps_a_requests_own_length_cap(tiny_model_dir):
    """A planner Request may set its own max_new_tokens; fresh samples honour it, and so must the
    responses reused from the bank (they were verified under the executor's global cap: a request
    for 5 tokens got 16-token responses back, and their continuations ran to 16)."""
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    eng = ContinuousEngine(model, [], tok.pad_token_id, dtype=torch.float32, batch_size=4, num_slots=4, record_topk=8)
    ex = RolloutExecutor(eng, {"p0": tok("12+34=")["input_ids"]}, 16, 1.0, speculative=True)
    first = ex.generate([Request("p0", 4)])  # no EOS: every banked response is 16 tokens long
    assert [len(o.response_ids) for o in first.groups["p0"]] == [16] * 4
    out = ex.generate([Request("p0", 4, max_new_tokens=5)])
    assert eng.stats["spec_candidates"] == 4  # the bank was drawn on
    assert [len(o.response_ids) for o in out.groups["p0"]] == [5] * 4
    assert all(o.finish_reason == "length" for o in out.groups["p0"])
