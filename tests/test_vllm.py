"""The vllm engine (experimental): runs only where vLLM and a CUDA GPU exist; skipped elsewhere."""

import pytest
import torch

from rollwise.engine import GenerationRequest
from rollwise.engine.vllm import VLLMUnavailable, vllm_available

needs_vllm = pytest.mark.skipif(not vllm_available(), reason="needs vLLM and a CUDA GPU")


def test_clear_error_without_vllm_or_cuda(tiny_model_dir):
    if vllm_available():
        pytest.skip("vLLM and CUDA are present")
    from rollwise.engine.vllm import VLLMEngine

    with pytest.raises(VLLMUnavailable, match="rollout.engine"):
        VLLMEngine(str(tiny_model_dir), [1], 0)


@needs_vllm
def test_vllm_generates_with_logprobs_resumes_and_loads_weights(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from rollwise.engine.vllm import VLLMEngine

    eng = VLLMEngine(str(tiny_model_dir), [1], 0, torch.float32, gpu_memory_utilization=0.2, max_model_len=256)
    reqs = [GenerationRequest([5, 6, 7, 8], 24, temperature=1.0) for _ in range(8)]
    outs = eng.generate(reqs)
    assert all(len(o.response_ids) == len(o.logprobs) == len(o.versions) > 0 for o in outs)
    assert all(lp <= 0 for o in outs for lp in o.logprobs)
    # behaviour log-probs are the model's: compare with a fresh forward on the GPU
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).cuda()
    ids = torch.tensor([[5, 6, 7, 8] + outs[0].response_ids], device="cuda")
    with torch.no_grad():
        logp = model(ids).logits[0, 3:-1].float().log_softmax(-1)
    ref = logp.gather(-1, ids[0, 4:].unsqueeze(-1)).squeeze(-1).cpu()
    assert torch.allclose(ref, torch.tensor(outs[0].logprobs), atol=2e-2)
    # a round cut by a token budget comes back resumable and finishes with its prefix kept
    fin, unfinished = eng.run_round([GenerationRequest([5, 6, 7], 40, request_id=i) for i in range(4)], token_budget=8)
    assert unfinished and all(u.prefix_ids for u in unfinished if u.prefix_ids is not None)
    fin2, rest = eng.run_round(unfinished)
    assert not rest and len(fin) + len(fin2) == 4
    # weights load in place: zeroed weights change greedy output
    greedy = [GenerationRequest([5, 6, 7, 8], 8, greedy=True)]
    before = eng.generate(greedy)[0].response_ids
    eng.load_weights({k: torch.zeros_like(v) for k, v in model.state_dict().items()}, version=3)
    after = eng.generate(greedy)[0]
    assert after.response_ids != before and after.versions == [3] * len(after.response_ids)


class _FakeLLMEngine:
    """vLLM's add_request/step/abort_request, one token per live request per step: request k of a
    round ends after its max_tokens, so requests finish at different steps (no GPU needed)."""

    def __init__(self):
        self.live, self.steps = {}, 0

    def add_request(self, key, prompt, params):
        self.live[key] = (params, [])

    def step(self):
        from types import SimpleNamespace as NS

        self.steps += 1
        outs = []
        for key, (params, toks) in list(self.live.items()):
            toks.append(3)
            done = len(toks) >= params.max_tokens
            out = NS(token_ids=list(toks), logprobs=[{3: NS(logprob=-0.5)}] * len(toks), finish_reason="length")
            outs.append(NS(request_id=key, outputs=[out], finished=done))
            if done:
                del self.live[key]
        return outs

    def abort_request(self, keys):
        for k in keys:
            self.live.pop(k, None)


def test_vllm_feed_adds_requests_to_the_running_round(monkeypatch):
    import itertools
    import sys
    from types import ModuleType, SimpleNamespace

    from rollwise.engine.vllm import VLLMEngine

    fake = ModuleType("vllm")
    fake.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    inputs = ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    eng = object.__new__(VLLMEngine)  # the protocol logic only: no model, no GPU
    eng.llm = SimpleNamespace(llm_engine=_FakeLLMEngine())
    eng.eos, eng.top_p, eng.top_k, eng.version, eng.stats = [1], 1.0, 0, 0, {"sampled_tokens": 0.0}
    eng._ids = itertools.count()
    eng.generator = torch.Generator().manual_seed(0)
    reqs = [GenerationRequest([5], n, temperature=1.0, request_id=i) for i, n in enumerate([2, 6, 4])]
    seen = []

    def feed(fin):
        seen.extend(o.request_id for o in fin)
        return [GenerationRequest([5], 3, temperature=1.0, request_id=10 + o.request_id) for o in fin if o.request_id < 10]

    done, pending = eng.run_round(reqs, feed=feed)
    assert not pending
    assert sorted(o.request_id for o in done) == [0, 1, 2, 10, 11, 12]
    assert sorted(seen) == [0, 1, 2, 10, 11, 12]
    assert eng.llm.llm_engine.steps == 9  # request 1 (6 tokens) ends at step 6, its follow-up (3) at step 9
    assert all(len(o.response_ids) == len(o.logprobs) == len(o.versions) for o in done)


def test_each_sampled_request_gets_a_seed_from_the_engines_saved_stream(monkeypatch):
    """vLLM draws with each request's own seed, taken from the engine's generator (saved in
    checkpoints) or from evaluation's: a resumed run samples the same, and evaluating between steps
    changes nothing. Checked on the seeds handed to a stand-in SamplingParams (no GPU here)."""
    import sys
    import types

    from rollwise.engine.vllm import VLLMEngine

    fake = types.ModuleType("vllm")
    fake.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", fake)
    eng = VLLMEngine.__new__(VLLMEngine)
    eng.eos, eng.top_p, eng.top_k, eng.version = [1], 1.0, 0, 0
    eng.generator = torch.Generator().manual_seed(7)
    req = GenerationRequest([5, 6], 8, temperature=1.0)
    state = eng.state_dict()
    first = [eng._params(req)["seed"] for _ in range(3)]
    assert len(set(first)) == 3 and eng._params(GenerationRequest([5], 8, greedy=True)).get("seed") is None
    eng.load_state_dict(state)  # resumed: the same seeds again
    eng._params(req, torch.Generator().manual_seed(99))  # an evaluation's draw uses its own generator
    assert [eng._params(req)["seed"] for _ in range(3)] == first


def test_run_round_cuts_a_carried_sample_already_at_its_cap_without_asking_vllm(monkeypatch):
    """A carried sample whose prefix fills a lowered rollout.max_completion_length ends as "length" at the cap
    (vLLM was asked for one token more); the others go to vLLM. vLLM is faked: the round logic only."""
    import itertools
    import sys
    import types
    from types import SimpleNamespace

    from rollwise.engine.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: kw))
    monkeypatch.setitem(sys.modules, "vllm.inputs", types.SimpleNamespace(TokensPrompt=lambda **kw: kw))
    asked = {}

    class FakeEngine:  # every request finishes at once with two tokens (EOS 1 last)
        def add_request(self, key, prompt, params):
            asked[key] = params

        def step(self):
            out = [SimpleNamespace(request_id=k, finished=True, outputs=[SimpleNamespace(
                token_ids=[7, 1], logprobs=[{7: SimpleNamespace(logprob=-0.5)}, {1: SimpleNamespace(logprob=-0.25)}],
                finish_reason="stop")]) for k in asked]
            asked.clear()
            return out

        def abort_request(self, keys):
            raise AssertionError("nothing is left to abort")

    eng = object.__new__(VLLMEngine)
    eng.llm, eng._ids, eng.generator = SimpleNamespace(llm_engine=FakeEngine()), itertools.count(), torch.Generator()
    eng.eos, eng.top_p, eng.top_k, eng.version, eng.stats = [1], 1.0, 0, 3, {"sampled_tokens": 0}
    at_cap = GenerationRequest([5, 6], 4, 1.0, prefix_ids=[9, 9, 9, 9], prefix_logprobs=[-1.0] * 4,
                               prefix_versions=[2] * 4, request_id=0)
    fresh = GenerationRequest([5, 6], 4, 1.0, request_id=1)
    finished, unfinished = eng.run_round([at_cap, fresh])
    assert unfinished == []
    by_id = {o.request_id: o for o in finished}
    assert (by_id[0].response_ids, by_id[0].finish_reason, by_id[0].versions) == ([9, 9, 9, 9], "length", [2] * 4)
    assert (by_id[1].response_ids, by_id[1].logprobs, by_id[1].versions) == ([7, 1], [-0.5, -0.25], [3, 3])
    assert eng.stats["sampled_tokens"] == 2


def _fake_vllm_engine(monkeypatch, llm_engine, eos=(1,)):
    """A VLLMEngine whose vLLM is faked: the protocol logic only (no model, no GPU)."""
    import itertools
    import sys
    import types
    from types import SimpleNamespace

    from rollwise.engine.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: kw))
    monkeypatch.setitem(sys.modules, "vllm.inputs", types.SimpleNamespace(TokensPrompt=lambda **kw: kw))
    eng = object.__new__(VLLMEngine)
    eng.llm, eng._ids, eng.generator = SimpleNamespace(llm_engine=llm_engine), itertools.count(), torch.Generator()
    eng.eos, eng.top_p, eng.top_k, eng.version, eng.stats = list(eos), 1.0, 0, 0, {"sampled_tokens": 0}
    return eng


def test_an_eos_that_is_the_last_allowed_token_finishes_as_stop(monkeypatch):
    """vLLM v1 checks the length cap before EOS: a response whose EOS is exactly its last allowed token
    comes back with finish_reason "length" and the EOS in its tokens. The HF engines call it "stop", so
    does this one; a response cut at the cap on another token stays "length"."""
    from types import SimpleNamespace

    class FakeEngine:  # every request ends at its max_tokens with the tokens given by its prompt's first id
        def __init__(self):
            self.live = {}

        def add_request(self, key, prompt, params):
            self.live[key] = (prompt["prompt_token_ids"], params["max_tokens"])

        def step(self):
            outs = []
            for key, (prompt, n) in self.live.items():
                toks = [7] * (n - 1) + [prompt[0]]
                outs.append(SimpleNamespace(request_id=key, finished=True, outputs=[SimpleNamespace(
                    token_ids=toks, logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in toks],
                    finish_reason="length")]))
            self.live.clear()
            return outs

        def abort_request(self, keys):
            raise AssertionError("nothing is left to abort")

    eng = _fake_vllm_engine(monkeypatch, FakeEngine(), eos=(1, 2))
    outs = eng.generate([GenerationRequest([1, 5], 3), GenerationRequest([9, 5], 3), GenerationRequest([2, 5], 4),
                         GenerationRequest([1, 5], 4, prefix_ids=[7], prefix_logprobs=[-1.0], prefix_versions=[0])])
    assert [o.response_ids for o in outs] == [[7, 7, 1], [7, 7, 9], [7, 7, 7, 2], [7, 7, 7, 1]]
    assert [o.finish_reason for o in outs] == ["stop", "length", "stop", "stop"]
