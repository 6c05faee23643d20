"""The vllm engine's protocol logic against a stand-in `vllm` (no GPU, no vLLM here): what happens around
weight updates, failing callbacks and two engines of one process."""

import itertools
import sys
import threading
import time
import types
from types import SimpleNamespace

import pytest
import torch

from rollwise.engine import GenerationRequest


class _StepEngine:
    """vLLM's add_request/step/abort_request: one token (3) per live request per step."""

    def __init__(self, busy=None):
        self.live, self.aborted, self.busy = {}, [], busy

    def add_request(self, key, prompt, params):
        self.live[key] = (params, [])

    def step(self):
        if self.busy is not None:  # count engines inside a step at once
            with self.busy["lock"]:
                self.busy["now"] += 1
                self.busy["max"] = max(self.busy["max"], self.busy["now"])
            time.sleep(0.002)
            with self.busy["lock"]:
                self.busy["now"] -= 1
        outs = []
        for key, (params, toks) in list(self.live.items()):
            toks.append(3)
            done = len(toks) >= params["max_tokens"]
            out = SimpleNamespace(token_ids=list(toks), logprobs=[{3: SimpleNamespace(logprob=-0.5)}] * len(toks),
                                  finish_reason="length")
            outs.append(SimpleNamespace(request_id=key, outputs=[out], finished=done))
            if done:
                del self.live[key]
        return outs

    def abort_request(self, keys):
        self.aborted.extend(keys)
        for k in keys:
            self.live.pop(k, None)


def _engine(monkeypatch, llm):
    from rollwise.engine.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: kw))
    monkeypatch.setitem(sys.modules, "vllm.inputs", types.SimpleNamespace(TokensPrompt=lambda **kw: kw))
    eng = object.__new__(VLLMEngine)
    eng.llm, eng._ids, eng.generator = llm, itertools.count(), torch.Generator().manual_seed(0)
    eng.eos, eng.top_p, eng.top_k, eng.version, eng.stats = [1], 1.0, 0, 0, {"sampled_tokens": 0}
    return eng


def test_a_refused_prefix_cache_reset_after_a_weight_update_is_not_ignored(monkeypatch):
    """vLLM's reset_prefix_cache returns False (and only logs) while KV blocks are in use; the engine went on
    under the new version number with prefixes cached from the old weights."""
    calls = []
    llm = SimpleNamespace(collective_rpc=lambda fn, args=(): calls.append(len(args[0])),
                          reset_prefix_cache=lambda: False, llm_engine=_StepEngine())
    eng = _engine(monkeypatch, llm)
    with pytest.warns(UserWarning, match="did not reset its prefix cache"):
        eng.load_weights({"w": torch.zeros(2)}, version=5)
    assert calls == [1] and eng.version == 5  # the weights are in: the version moves on, the stale cache is said
    llm.reset_prefix_cache = lambda: True  # accepted (or None, as older vLLM returned)
    eng.load_weights({"w": torch.zeros(2)}, version=6)
    assert eng.version == 6


def test_a_round_that_raises_leaves_no_request_running_in_vllm(monkeypatch):
    """A feed (or stop_when) callback that raises ended run_round with its requests still in vLLM: later rounds
    decoded them unseen and their KV blocks stayed taken."""
    llm_engine = _StepEngine()
    eng = _engine(monkeypatch, SimpleNamespace(llm_engine=llm_engine))

    def feed(fin):
        raise ValueError("planner failed")

    with pytest.raises(ValueError, match="planner failed"):
        eng.run_round([GenerationRequest([5], n, temperature=1.0, request_id=i) for i, n in enumerate([1, 6, 6])],
                      feed=feed)
    assert llm_engine.live == {} and sorted(llm_engine.aborted) == ["rw-1", "rw-2"]


def test_two_engines_of_one_process_never_step_vllm_at_once(monkeypatch):
    """vLLM's forward context is a module global: the asynchronous loop's rollout thread and the evaluation
    engine, both vLLM in one process, stepping together would read each other's attention metadata."""
    busy = {"lock": threading.Lock(), "now": 0, "max": 0}
    engines = [_engine(monkeypatch, SimpleNamespace(llm_engine=_StepEngine(busy))) for _ in range(2)]
    errors = []

    def run(eng):
        try:
            for _ in range(3):
                eng.run_round([GenerationRequest([5], 8, temperature=1.0, request_id=i) for i in range(2)])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and busy["max"] == 1
