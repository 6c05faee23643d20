from dataclasses import replace

import pytest
import torch

from rollwise.engine import GenerationOutput, GenerationRequest, HFEngine
from rollwise.engine.continuous import ContinuousEngine, _Row, _Slots, peak_decode_throughput
from rollwise.models import load_model, load_tokenizer
from rollwise.training.logprobs import pack, response_logprobs

TEXTS = ["12+34=", "a much longer prompt: 7*8=", "x", "hello there", "9-3=?", "what is 2*21? answer:"]
LIMITS = [12, 3, 20, 7, 15, 5]


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    return tok, model, [tok(t)["input_ids"] for t in TEXTS]


def _perturbed(tiny_model_dir, scale):
    """The tiny model with noise added: its greedy outputs stop repeating one character."""
    model = load_model(str(tiny_model_dir))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model


@pytest.fixture(scope="module")
def varied(setup, tiny_model_dir):
    return _perturbed(tiny_model_dir, 0.3)


def _engine(tok, model, num_slots=2, batch_size=2, seed=0, eos=None):
    eos = eos if eos is not None else [tok.eos_token_id]
    return ContinuousEngine(model, eos, tok.pad_token_id, dtype=torch.float32, batch_size=batch_size, seed=seed,
                            num_slots=num_slots)


def _fresh_logprobs(model, prompts, responses, pad, temperature):
    batch = pack(prompts, responses, pad)
    with torch.no_grad():
        lp, _ = response_logprobs(model, batch, temperature=temperature, chunk_tokens=7)
    return lp


def test_greedy_matches_one_at_a_time_with_slot_reuse(setup, varied):
    tok, _, prompts = setup
    model = varied
    reqs = [GenerationRequest(p, n, greedy=True) for p, n in zip(prompts, LIMITS)]
    single = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, dtype=torch.float32, batch_size=1)
    ref = [single.generate([r])[0] for r in reqs]
    # A token the greedy run emits mid-way becomes a second EOS, so some rows stop early ("stop").
    extra = ref[0].response_ids[4]
    eos = [tok.eos_token_id, extra]
    single.eos = set(eos)
    ref = [single.generate([r])[0] for r in reqs]
    assert any(o.finish_reason == "stop" for o in ref) and any(o.finish_reason == "length" for o in ref)
    for slots, bs in [(2, 2), (3, 1), (4, 4)]:
        eng = _engine(tok, model, num_slots=slots, batch_size=bs, eos=eos)
        outs = eng.generate(reqs)
        assert [o.response_ids for o in outs] == [o.response_ids for o in ref]
        assert [o.finish_reason for o in outs] == [o.finish_reason for o in ref]
        for o, r in zip(outs, ref):
            torch.testing.assert_close(torch.tensor(o.logprobs), torch.tensor(r.logprobs), atol=1e-4, rtol=1e-4)
        assert eng.stats["prefill_calls"] < len(reqs) or bs == 1  # waiting prompts prefill together
    assert eng.stats["prefill_calls"] < len(reqs)


def test_behaviour_logprobs_match_fresh_forward(setup):
    tok, model, prompts = setup
    eng = _engine(tok, model, num_slots=3, batch_size=2, seed=1)
    outs = eng.generate([GenerationRequest(p, n, temperature=0.7) for p, n in zip(prompts, LIMITS)])
    lp = _fresh_logprobs(model, prompts, [o.response_ids for o in outs], tok.pad_token_id, 0.7)
    for b, o in enumerate(outs):
        n = len(o.response_ids)
        assert 0 < n <= LIMITS[b] and o.versions == [0] * n and o.request_id is None
        torch.testing.assert_close(lp[b, :n], torch.tensor(o.logprobs), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("hold", [False, True])
def test_resume_after_token_budget_equals_uninterrupted_run(setup, varied, hold):
    tok, _, prompts = setup
    model = varied
    reqs = [GenerationRequest(p, n, greedy=True, request_id=10 + i) for i, (p, n) in enumerate(zip(prompts, LIMITS))]
    full = _engine(tok, model).generate(reqs)
    eng = _engine(tok, model, num_slots=2)
    done, pending = eng.run_round(reqs, token_budget=9, hold=hold)
    assert 9 <= sum(len(o.response_ids) for o in done) + sum(len(r.prefix_ids) for r in pending) <= 10
    assert any(r.prefix_ids for r in pending) and any(not r.prefix_ids for r in pending)
    eng.load_weights(model.state_dict(), version=1)  # same weights, new version
    eng.generate([GenerationRequest(prompts[0], 2)])  # an evaluation in between leaves held rows alone
    prefilled = eng.stats["prefill_tokens"]
    done2, pending2 = eng.run_round(pending)
    resumed_ctx = sum(len(r.prefix_ids) for r in pending)
    if hold:  # kept in their slots: the resumed prefixes are not prefilled again
        assert eng.stats["prefill_tokens"] - prefilled <= sum(len(r.prompt_ids) for r in pending if not r.prefix_ids)
    else:  # prefix on top of the cached prompt (or the whole context)
        assert eng.stats["prefill_tokens"] - prefilled >= resumed_ctx
    assert not pending2
    by_id = {o.request_id: o for o in done + done2}
    assert sorted(by_id) == [r.request_id for r in reqs] and len(done) + len(done2) == len(reqs)
    resumed = {r.request_id: r for r in pending if r.prefix_ids}
    for r, f in zip(reqs, full):
        o = by_id[r.request_id]
        assert o.response_ids == f.response_ids and o.finish_reason == f.finish_reason
        if r.request_id in resumed:
            k = len(resumed[r.request_id].prefix_ids)
            assert o.versions == [0] * k + [1] * (len(o.response_ids) - k) and k < len(o.response_ids)
            assert o.logprobs[:k] == resumed[r.request_id].prefix_logprobs
        torch.testing.assert_close(torch.tensor(o.logprobs), torch.tensor(f.logprobs), atol=1e-4, rtol=1e-4)


def test_resumed_continuation_logprobs_match_full_forward_under_new_weights(setup, tiny_model_dir):
    tok, model, prompts = setup
    eng = _engine(tok, model, num_slots=3, seed=3)
    reqs = [GenerationRequest(p, 16, temperature=0.9) for p in prompts[:4]]
    _, pending = eng.run_round(reqs, token_budget=12)
    new_model = _perturbed(tiny_model_dir, 0.02)
    eng.load_weights(new_model.state_dict(), version=2)
    outs, left = eng.run_round(pending)
    assert not left and sorted(o.request_id for o in outs) == [0, 1, 2, 3] and any(r.prefix_ids for r in pending)
    outs = sorted(outs, key=lambda o: [r.request_id for r in pending].index(o.request_id))  # finish -> pending order
    ctx = [r.prompt_ids for r in pending]
    lp_old = _fresh_logprobs(model, ctx, [o.response_ids for o in outs], tok.pad_token_id, 0.9)
    lp_new = _fresh_logprobs(new_model, ctx, [o.response_ids for o in outs], tok.pad_token_id, 0.9)
    for b, (r, o) in enumerate(zip(pending, outs)):
        k, n = len(r.prefix_ids), len(o.response_ids)
        assert o.response_ids[:k] == r.prefix_ids and o.versions == [0] * k + [2] * (n - k)
        torch.testing.assert_close(lp_old[b, :k], torch.tensor(o.logprobs[:k]), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lp_new[b, k:n], torch.tensor(o.logprobs[k:]), atol=1e-4, rtol=1e-4)


def test_stop_when_accounts_for_every_request(setup):
    tok, model, prompts = setup
    reqs = [GenerationRequest(p, n, temperature=1.0, request_id=100 + i)
            for i, (p, n) in enumerate(zip(prompts * 2, LIMITS * 2))]
    eng = _engine(tok, model, num_slots=3, batch_size=3)
    done, pending = eng.run_round(reqs, stop_when=lambda fin: len(fin) >= 2)
    assert len(done) >= 2 and all(o.finish_reason in ("stop", "length") for o in done)
    ids = [o.request_id for o in done] + [r.request_id for r in pending]
    assert sorted(ids) == [r.request_id for r in reqs]
    started = [r for r in pending if r.prefix_ids]
    assert 1 <= len(started) <= 3 and pending[: len(started)] == started  # in-flight ones first
    originals = {r.request_id: r for r in reqs}
    assert all(r == originals[r.request_id] for r in pending if not r.prefix_ids)  # never started: unchanged
    done2, pending2 = eng.run_round(pending)
    assert not pending2 and sorted(o.request_id for o in done + done2) == sorted(originals)


def test_feed_adds_requests_to_the_running_round(setup):
    tok, model, prompts = setup
    reqs = [GenerationRequest(p, n, temperature=1.0, request_id=i) for i, (p, n) in enumerate(zip(prompts, LIMITS))]
    eng = _engine(tok, model, num_slots=3, batch_size=3)
    eng.eos = set()  # every request runs to its cap: the follow-up's longer cap is then checked exactly
    seen: list[int] = []

    def feed(fin):
        seen.extend(o.request_id for o in fin)
        # the first finished request gets one follow-up, longer than any request of the round
        return [GenerationRequest(prompts[0], 25, temperature=1.0, request_id=99)] if len(seen) == len(fin) else []

    done, pending = eng.run_round(reqs, feed=feed)
    assert not pending and sorted(o.request_id for o in done) == [*range(len(reqs)), 99]
    assert sorted(seen) == sorted(o.request_id for o in done)  # feed saw every finished output once
    out99 = next(o for o in done if o.request_id == 99)  # room was made for its longer cap
    assert out99.finish_reason == "length" and len(out99.response_ids) == 25
    with pytest.raises(ValueError, match="request_id"):
        eng.run_round(reqs[:1], feed=lambda fin: [GenerationRequest(prompts[0], 3)] if fin else [])


def test_complete_prefix_and_missing_ids(setup):
    tok, model, prompts = setup
    eng = _engine(tok, model)
    eos = tok.eos_token_id
    reqs = [GenerationRequest(prompts[0], 5, prefix_ids=[7, eos], prefix_logprobs=[-1.0, -2.0], prefix_versions=[0, 0]),
            GenerationRequest(prompts[1], 2, prefix_ids=[7, 8], prefix_logprobs=[-1.0, -2.0], prefix_versions=[0, 0]),
            GenerationRequest(prompts[2], 4)]
    done, pending = eng.run_round(reqs, token_budget=1)
    by_id = {o.request_id: o for o in done}
    assert by_id[0] == GenerationOutput([7, eos], [-1.0, -2.0], [0, 0], "stop", 0)
    assert by_id[1].finish_reason == "length" and by_id[1].response_ids == [7, 8]
    assert [r.request_id for r in pending] == [2] and len(pending[0].prefix_ids) == 1
    with pytest.raises(ValueError):
        eng.run_round([replace(reqs[0], prefix_versions=[])])


def test_sampling_is_seeded_and_rng_state_round_trips(setup):
    tok, model, prompts = setup
    reqs = [GenerationRequest(p, 8) for p in prompts[:4]]
    runs = [[o.response_ids for o in _engine(tok, model, seed=5).generate(reqs)] for _ in range(2)]
    assert runs[0] == runs[1]
    eng = _engine(tok, model, seed=5)
    state = eng.state_dict()
    first = [o.response_ids for o in eng.generate(reqs)]
    second = [o.response_ids for o in eng.generate(reqs)]
    eng.load_state_dict(state)
    assert [o.response_ids for o in eng.generate(reqs)] == first and first == runs[0] and second != first


def test_slots_layout_reuse_and_compaction():
    """Rows are left-padded to one write column; a freed slot takes the last row; growth trims padding."""
    def kv(L, val):  # one layer, 2 heads, head dim 4
        t = torch.full((2, L, 4), float(val))
        return [(t, t.clone())]

    def rows(n):
        return [_Row(GenerationRequest([1], 4)) for _ in range(n)]

    s = _Slots(3)
    s.admit([kv(3, 1.0)], rows(1), headroom=2)
    assert (s.n, s.cap, s.B) == (3, 6, 1)
    s.admit([kv(5, 2.0), kv(2, 3.0)], rows(2), headroom=2)  # longer context: the first row shifts right
    assert s.n == 5 and s.mask[:3, :5].tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
    k = s.layers[0].kbuf
    assert k[0, 0, 2:5, 0].tolist() == [1, 1, 1] and k[2, 0, 3:5, 0].tolist() == [3, 3]
    assert s.pos[:3].tolist() == [3, 5, 2]
    s.rows[1].finish = "stop"
    assert len(s.remove_finished()) == 1 and s.B == 2
    assert s.mask[1, :5].tolist() == [0, 0, 0, 1, 1] and k[1, 0, 3, 0] == 3 and s.pos[:2].tolist() == [3, 2]
    s.make_room(None, 0, headroom=2)  # n + 1 <= cap: nothing moves
    assert s.n == 5 and s.relayouts == 1
    s.n = 6  # as if one decode step wrote column 5; now full: leading padding [0, 2) is trimmed
    s.mask[:2, 5] = 1
    s.make_room(None, 0, headroom=2)
    assert s.n == 4 and s.mask[:2, :4].tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]] and s.cap == 6


def test_peak_decode_throughput_runs(setup):
    tok, model, prompts = setup
    eng = _engine(tok, model, num_slots=2)
    state = eng.state_dict()
    tps = peak_decode_throughput(eng, prompts[0], num_slots=4, new_tokens=6)
    assert tps > 0 and eng.num_slots == 2 and eng.eos == {tok.eos_token_id}
    assert eng.stats["decode_tokens"] == 1 + 4 * 5  # warm-up step + 5 decode steps of 4 full slots
    assert torch.equal(eng.state_dict()["generator"], state["generator"])


def test_transposed_weights_decode_the_same(tiny_model_dir):
    """The continuous engine's decode with input-major weights (the CPU fp32 default) gives the same greedy
    tokens and log-probs equal up to fp32 rounding (sampled tokens may part after a near-tie)."""
    from rollwise.engine.hf import input_major

    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    eos = [tok.eos_token_id]
    engines = [ContinuousEngine(model, eos, tok.pad_token_id, dtype=torch.float32, batch_size=4, seed=3,
                                transpose_weights=t) for t in (False, True)]
    assert [input_major(e.model) for e in engines] == [False, True]
    reqs = [GenerationRequest(tok(p)["input_ids"], 12, greedy=True)
            for p in ("1+1=", "a longer prompt here", "x", "7*8=")] * 2
    a, b = (e.generate(reqs) for e in engines)
    assert [o.response_ids for o in a] == [o.response_ids for o in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=1e-4)


def test_prefix_cache_eviction_within_a_round_loses_no_entry(setup, varied):
    """A round that prefills new prompts into a full prefix cache must still find the cached
    prompts its other rows (fresh samples and resumed prefixes) rely on."""
    tok, _, prompts = setup
    eng = ContinuousEngine(varied, [tok.eos_token_id], tok.pad_token_id, dtype=torch.float32, batch_size=4,
                           num_slots=4, prefix_cache=1)
    ref = _engine(tok, varied, num_slots=4, batch_size=4)
    eng.eos = ref.eos = set()
    # fixed weights throughout: prompt 0 stays cached, a partial rollout of it waits to resume
    done, pending = eng.run_round([GenerationRequest(prompts[0], 6, greedy=True, request_id=1)], token_budget=3)
    assert not done and pending[0].prefix_ids and list(eng._prefix) == [tuple(prompts[0])]
    reqs = [pending[0], GenerationRequest(prompts[0], 4, greedy=True, request_id=2),
            GenerationRequest(prompts[1], 4, greedy=True, request_id=3),
            GenerationRequest(prompts[2], 4, greedy=True, request_id=4)]
    out = {o.request_id: o for o in eng.generate(reqs)}  # prompts 1 and 2 evict prompt 0 mid-prefill
    want = {o.request_id: o for o in ref.generate([GenerationRequest(prompts[0], 6, greedy=True, request_id=1),
                                                   *reqs[1:]])}
    assert sorted(out) == [1, 2, 3, 4]
    for k, o in out.items():
        assert o.response_ids == want[k].response_ids, k
    assert len(eng._prefix) == 1


@pytest.mark.parametrize("engine_cls", [HFEngine, ContinuousEngine])
def test_lm_head_gets_a_contiguous_input(setup, engine_cls):
    """A prefill hands the head a strided view of its last positions; torch's CPU linear on such a
    view took 4.8-5.0 s and 3.5 GB of transient memory in bf16 (6-7 ms copied), so the engine copies it."""
    tok, model, prompts = setup
    eng = engine_cls(model, [tok.eos_token_id], tok.pad_token_id, dtype=torch.float32, batch_size=4, seed=0)
    seen = []
    eng.model.get_output_embeddings().register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    out = eng.generate([GenerationRequest(p, 4, greedy=True) for p in prompts])
    assert len(out) == len(prompts) and len(seen) > 2
    assert all(seen)


@pytest.mark.parametrize("arch", ["granite", "cohere"])
def test_models_that_rescale_their_logits_get_the_same_logprobs_everywhere(setup, arch):
    """Granite divides its logits by config.logits_scaling, Cohere multiplies them by logit_scale: the trainer's
    log-probs and a response resumed from a prefix (the engine's own output-layer path) must match the
    model's full forward, as a fresh response does."""
    from transformers import CohereConfig, CohereForCausalLM, GraniteConfig, GraniteForCausalLM

    tok, _, prompts = setup
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    torch.manual_seed(0)
    if arch == "granite":
        model = GraniteForCausalLM(GraniteConfig(**common, logits_scaling=8.0))
    else:
        model = CohereForCausalLM(CohereConfig(**common, logit_scale=0.25))
    model.eval()
    reqs = [GenerationRequest(p, 8, temperature=0.9, request_id=i) for i, p in enumerate(prompts[:3])]
    full = _engine(tok, model, num_slots=3, seed=1).generate(reqs)
    with torch.no_grad():  # the model's own forward, logits transform included
        ref = []
        for r, o in zip(reqs, full):
            ids = torch.tensor([r.prompt_ids + o.response_ids])
            logits = model(input_ids=ids).logits[0, len(r.prompt_ids) - 1 : -1].float() / 0.9
            ref.append(torch.log_softmax(logits, -1).gather(1, torch.tensor(o.response_ids)[:, None])[:, 0])
    for o, want in zip(full, ref):
        torch.testing.assert_close(torch.tensor(o.logprobs), want, atol=1e-4, rtol=1e-4)
    trainer = _fresh_logprobs(model, [r.prompt_ids for r in reqs], [o.response_ids for o in full], tok.pad_token_id, 0.9)
    for b, (o, want) in enumerate(zip(full, ref)):
        torch.testing.assert_close(trainer[b, : len(o.response_ids)], want, atol=1e-4, rtol=1e-4)
    # a response resumed from its first 3 tokens: the first new token goes through the engine's _head
    eng = _engine(tok, model, num_slots=3, seed=1)
    resumed = [replace(r, prefix_ids=o.response_ids[:3], prefix_logprobs=o.logprobs[:3], prefix_versions=[0] * 3)
               for r, o in zip(reqs, full)]
    outs = {o.request_id: o for o in eng.generate(resumed)}
    for r, want in zip(reqs, ref):
        o = outs[r.request_id]
        n = min(len(o.response_ids), len(want))
        new = torch.tensor(o.logprobs[3:n])
        assert n > 3  # else the resumed path below would go unchecked
        if n > 3:  # the resumed tokens' log-probs under the same weights: the full forward's at those tokens
            ids = torch.tensor([r.prompt_ids + o.response_ids])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(r.prompt_ids) - 1 : -1].float() / 0.9
            exp = torch.log_softmax(logits, -1).gather(1, torch.tensor(o.response_ids)[:, None])[:, 0][3:n]
            torch.testing.assert_close(new, exp, atol=1e-4, rtol=1e-4)


def test_a_resumed_prefix_without_its_topk_records_none(setup):
    """Top-k entry i must describe token i. A resumed request whose prefix came without its top-k
    (prefix_topk shorter than prefix_ids) gets no top-k at all: recording from the resume on would
    shift every entry by the prefix's length, and speculative verification would rebuild the old
    distribution of token n from another position's. Without top-k it takes its no-top-k path."""
    tok, model, prompts = setup
    eng = ContinuousEngine(model, [tok.eos_token_id], tok.pad_token_id, dtype=torch.float32, batch_size=2, seed=0,
                           num_slots=2, record_topk=3)
    eng.eos = set()  # every response runs to its cap: lengths are known
    first = eng.generate([GenerationRequest(prompts[0], 4)])[0]
    assert first.topk[0].shape == (4, 3)  # a fresh request: one top-k per token
    kept = dict(prefix_ids=first.response_ids[:2], prefix_logprobs=first.logprobs[:2], prefix_versions=first.versions[:2])
    with_topk = eng.generate([GenerationRequest(prompts[0], 6, prefix_topk=(first.topk[0][:2], first.topk[1][:2]),
                                                **kept)])[0]
    assert with_topk.topk[0].shape == (6, 3) and torch.equal(with_topk.topk[0][:2], first.topk[0][:2])
    without, partial = eng.generate([GenerationRequest(prompts[0], 6, **kept),
                                     GenerationRequest(prompts[0], 6, prefix_topk=list(zip(*first.topk))[:1], **kept)])
    assert len(without.response_ids) == len(partial.response_ids) == 6
    assert without.topk == [] and partial.topk == []
    # a round cut mid-way hands the missing top-k on: the resumed request still has none
    _, pending = eng.run_round([GenerationRequest(prompts[0], 6, request_id=0, **kept)], token_budget=1)
    assert len(pending[0].prefix_ids) == 3 and pending[0].prefix_topk == []
    # verification falls back to the full new distribution at the rejected token
    before = eng.stats["spec_no_topk"]
    out = eng.verify([prompts[0]], [without], lenience=1e-12, temperature=1.0, max_new_tokens=6)
    assert eng.stats["spec_no_topk"] == before + 1 and len(out) == 1
