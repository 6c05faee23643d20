"""Third audit of the generation engines: greedy equality with a plain argmax loop, behaviour log-probs
against teacher forcing, abort-and-resume, finish reasons at the boundaries, seeded sampling; each
defect found comes with its test (named for it)."""

from __future__ import annotations

import copy

import pytest
import torch

from rollwise.engine import GenerationRequest, HFEngine
from rollwise.engine.continuous import ContinuousEngine
from rollwise.engine.executor import RolloutExecutor
from rollwise.engine.hf import _filter_logits
from rollwise.models import load_model, load_tokenizer
from rollwise.planner.base import Request

TEXTS = ["12+34=", "a much longer prompt: 7*8=", "x", "hello there", "9-3=?", "what is 2*21? answer:", "q",
         "abcdefghijklmnopqrstuvwxyz0123"]
LIMITS = [12, 3, 20, 7, 15, 5, 1, 9]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    varied = load_model(str(tiny_model_dir))  # noise added: greedy outputs stop repeating one character
    with torch.no_grad():
        for p in varied.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return tok, model.eval(), varied.eval(), [tok(t)["input_ids"] for t in TEXTS]


def _cont(model, eos, pad, **kw):
    kw = {"dtype": torch.float32, "batch_size": 2, "num_slots": 3, **kw}
    return ContinuousEngine(model, eos, pad, **kw)


def _hf(model, eos, pad, **kw):
    kw = {"dtype": torch.float32, "batch_size": 3, **kw}
    return HFEngine(model, eos, pad, **kw)


@torch.no_grad()
def _argmax_loop(model, prompt, n, eos):
    """Greedy decoding the plainest way: the whole context through the model at every step, no cache."""
    ids, out = list(prompt), []
    for _ in range(n):
        t = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        out.append(t)
        ids.append(t)
        if t in eos:
            break
    return out


@torch.no_grad()
def _teacher_forced(model, prompt, response, temperature):
    """log softmax(logits / T)[token] of every response token, from one full forward (logits [L, V])."""
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float() / temperature
    return logits, torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]


# ---------------------------------------------------------------------------------------------- defects


@pytest.mark.parametrize("engine", [_hf, _cont])
def test_temperature_zero_is_greedy_even_at_tied_logits(engine):
    """A request at temperature 0 (greedy=False) was sampled from logits / 1e-6: among tied top logits
    the draw was random, so temperature 0 was not the argmax (vLLM treats it as greedy). With every
    logit equal the argmax is token 0 at each step; temperature 0 drew any of the vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                         pad_token_id=0, eos_token_id=1, bos_token_id=2)).eval()
    with torch.no_grad():
        model.lm_head.weight.zero_()  # every logit 0: a 40-way tie
    reqs = [GenerationRequest([5, 6, 7], 6, temperature=0.0), GenerationRequest([9], 6, temperature=0.0)]
    eng = engine(model, [1], 0, seed=3)
    outs = eng.generate(reqs * 3)
    assert [o.response_ids for o in outs] == [[0] * 6] * 6
    assert [o.response_ids for o in eng.generate([GenerationRequest([5, 6, 7], 6, greedy=True)])] == [[0] * 6]


@pytest.mark.parametrize("engine", [_hf, _cont])
def test_temperature_zero_matches_greedy_in_bf16(tiny, engine):
    """The same on a real (tiny) model in bf16, the engines' default dtype on a CPU: its logits tie often."""
    tok, model, _, prompts = tiny
    gen = torch.Generator().manual_seed(0)
    many = [torch.randint(4, 99, (int(torch.randint(1, 10, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(40)]
    eng = engine(model, [], tok.pad_token_id, dtype=torch.bfloat16, batch_size=8, seed=0)
    greedy = eng.generate([GenerationRequest(p, 30, greedy=True) for p in many])
    zero = eng.generate([GenerationRequest(p, 30, temperature=0.0) for p in many])
    assert [o.response_ids for o in zero] == [o.response_ids for o in greedy]


# ---------------------------------------------------------------------------------------------- checks


def test_greedy_matches_an_argmax_loop_as_requests_join_and_leave(tiny):
    """Prompts of 1 to 30 tokens (left padding), caps of 1 to 20, a second stop token: slots refill as rows
    finish, every configuration gives the argmax loop's tokens and finish reasons, and so does temperature 0."""
    tok, _, model, prompts = tiny
    eos0 = {tok.eos_token_id}
    stop_token = _argmax_loop(model, prompts[0], 12, eos0)[3]  # a token the greedy runs emit mid-way
    eos = sorted(eos0 | {stop_token})
    want = [_argmax_loop(model, p, n, set(eos)) for p, n in zip(prompts, LIMITS)]
    reasons = ["stop" if w[-1] in eos else "length" for w in want]
    assert "stop" in reasons and "length" in reasons
    reqs = [GenerationRequest(p, n, greedy=True) for p, n in zip(prompts, LIMITS)]
    zero = [GenerationRequest(p, n, temperature=0.0) for p, n in zip(prompts, LIMITS)]
    engines = [_hf(model, eos, tok.pad_token_id, batch_size=b) for b in (1, 3, 8)]
    engines += [_cont(model, eos, tok.pad_token_id, num_slots=s, batch_size=b, prefix_cache=c)
                for s, b, c in ((1, 1, 0), (2, 2, 64), (3, 1, 1), (8, 8, 64))]
    for eng in engines:
        for rs, expect in ((reqs, want), (zero, want), (reqs[::-1], want[::-1])):
            outs = eng.generate(rs)
            assert [o.response_ids for o in outs] == expect, type(eng).__name__
            assert [o.finish_reason for o in outs] == ["stop" if w[-1] in eos else "length" for w in expect]


@pytest.mark.parametrize("engine", [_hf, _cont])
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.7, 0, 1.0), (1.3, 5, 1.0), (0.9, 0, 0.8),
                                                              (1.0, 4, 0.7)])
def test_behaviour_logprobs_equal_teacher_forcing_for_every_token(tiny, engine, temperature, top_k, top_p):
    """Every token's behaviour log-prob (first and last included) is the full forward's log softmax(logits / T)
    (of the full distribution: the documented choice under top-k/top-p, as the trainer computes it); every
    sampled token lies inside the top-k/top-p support; responses end by EOS, by a second stop token and by
    the cap, each with its reason."""
    tok, _, model, prompts = tiny
    eos = [tok.eos_token_id, 9]  # 9: a frequent character acting as a stop token
    eng = engine(model, eos, tok.pad_token_id, top_k=top_k, top_p=top_p, seed=1)
    reqs = [GenerationRequest(p, n, temperature=temperature) for p, n in zip(prompts, LIMITS)] * 3
    outs = eng.generate(reqs)
    ends = set()
    for r, o in zip(reqs, outs):
        n = len(o.response_ids)
        logits, want = _teacher_forced(model, r.prompt_ids, o.response_ids, temperature)
        torch.testing.assert_close(torch.tensor(o.logprobs), want, atol=1e-4, rtol=1e-4)
        kept = torch.isfinite(_filter_logits(logits, top_k, top_p).gather(1, torch.tensor(o.response_ids)[:, None]))
        assert bool(kept.all())
        assert o.versions == [0] * n and 1 <= n <= r.max_new_tokens
        assert not set(o.response_ids[:-1]) & set(eos)
        if o.response_ids[-1] in eos:
            assert o.finish_reason == "stop"
            ends.add(o.response_ids[-1])
        else:
            assert o.finish_reason == "length" and n == r.max_new_tokens
            ends.add("length")
    assert ends >= {9, "length"}


def test_behaviour_logprobs_end_by_eos_at_several_temperatures(tiny):
    """With the model's EOS the only stop, and per-request temperatures mixed with greedy rows in one batch."""
    tok, _, varied, prompts = tiny
    model = copy.deepcopy(varied)
    with torch.no_grad():  # the EOS (tied) embedding made like a frequent character's: responses end by EOS
        emb = model.get_input_embeddings().weight
        emb[tok.eos_token_id] = 0.95 * emb[9]
    eos = [tok.eos_token_id]
    temps = [0.5, 1.0, 1.7, 0.8, 1.2, 0.3, 2.0, 1.0]
    greedy = [False, True, False, False, True, False, False, True]
    reqs = [GenerationRequest(p, 24, temperature=t, greedy=g) for p, t, g in zip(prompts, temps, greedy)] * 2
    for eng in (_hf(model, eos, tok.pad_token_id, seed=4), _cont(model, eos, tok.pad_token_id, seed=4)):
        outs = eng.generate(reqs)
        assert any(o.finish_reason == "stop" and o.response_ids[-1] == tok.eos_token_id for o in outs)
        for r, o in zip(reqs, outs):
            if r.greedy:
                assert o.response_ids == _argmax_loop(model, r.prompt_ids, 24, set(eos))
            torch.testing.assert_close(torch.tensor(o.logprobs),
                                       _teacher_forced(model, r.prompt_ids, o.response_ids, r.temperature)[1],
                                       atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("budget", [1, 3])
def test_rounds_cut_anywhere_resume_to_the_uninterrupted_result(tiny, budget):
    """Rounds cut every `budget` tokens (held in their slots or re-prefilled, alternately), a new weight
    version (same weights) after each: the same tokens and finish reasons as one uninterrupted run, each
    token carrying the version it was sampled under, and every token sampled once."""
    tok, _, model, prompts = tiny
    eos = [tok.eos_token_id, 9]
    reqs = [GenerationRequest(p, n, greedy=True, request_id=i) for i, (p, n) in enumerate(zip(prompts, LIMITS))]
    full = {o.request_id: o for o in _cont(model, eos, tok.pad_token_id).generate(reqs)}
    eng = _cont(model, eos, tok.pad_token_id)
    pending, done, versions, rounds = reqs, [], {}, 0
    while pending:
        before = {r.request_id: len(r.prefix_ids) for r in pending}
        fin, pending = eng.run_round(pending, token_budget=budget, hold=rounds % 2 == 0)
        for item in [*fin, *pending]:  # what this round added to each sequence: its version's tokens
            rid = item.request_id
            n = len(item.response_ids) if hasattr(item, "response_ids") else len(item.prefix_ids)
            versions.setdefault(rid, []).extend([eng.version] * (n - before.get(rid, 0)))
        done += fin
        rounds += 1
        eng.load_weights(model.state_dict(), version=rounds)
    assert rounds > 3 and len(done) == len(reqs)
    got = {o.request_id: o for o in done}
    for i, f in full.items():
        o = got[i]
        assert (o.response_ids, o.finish_reason) == (f.response_ids, f.finish_reason)
        assert o.versions == versions[i]
        torch.testing.assert_close(torch.tensor(o.logprobs), torch.tensor(f.logprobs), atol=1e-4, rtol=1e-4)
    assert any(len(set(o.versions)) > 1 for o in done)  # really resumed across versions
    assert eng.stats["sampled_tokens"] == sum(len(o.response_ids) for o in full.values())


@pytest.mark.parametrize(("keep_kv", "sync_tokens"), [(False, None), (True, None), (False, 3)])
def test_partial_rollouts_count_each_token_once(tiny, keep_kv, sync_tokens):
    """Across steps of partial rollouts (carried samples resumed, follow-up rounds, in-flight weight
    updates), the executor's per-step token counts add up to the tokens of the delivered samples plus those
    still carried: a carried prefix is not counted again when its sample finishes."""
    tok, _, model, _ = tiny
    prompts = {f"p{i}": tok(t)["input_ids"] for i, t in enumerate(TEXTS[:6])}
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids("1"), tok.convert_tokens_to_ids("e")]
    eng = _cont(model, eos, tok.pad_token_id, batch_size=3, num_slots=3, seed=0)

    def between():
        eng.load_weights(eng.model.state_dict(), version=eng.version)
        return True

    ex = RolloutExecutor(eng, prompts, max_new_tokens=24, temperature=1.0, partial=True, retention_limit=5,
                         keep_kv=keep_kv, sync_tokens=sync_tokens, between=between if sync_tokens else None)
    uids, counted, delivered, resumed = list(prompts), 0, 0, 0
    for step in range(5):
        for out in (ex.generate([Request(uids[(3 * step + k) % 6], 3 - k % 2) for k in range(3)]),
                    ex.generate([Request(uids[step % 6], 1)], first_round=False)):
            for group in (*out.groups.values(), *out.adopted.values()):
                delivered += sum(len(o.response_ids) for o in group)
                resumed += sum(len(set(o.versions)) > 1 for o in group)
        counted += ex.step_tokens()
        ex.metrics()
        eng.load_weights(eng.model.state_dict(), version=step + 1)
    carried = sum(len(q.prefix_ids) for g in ex.carried.values() for q in g.pending)
    carried += sum(len(o.response_ids) for g in ex.carried.values() for o in g.done)
    assert resumed > 0 and ex.totals["dropped_stale"] == 0
    assert counted == delivered + carried == eng.stats["sampled_tokens"]


def test_finish_reasons_at_the_boundaries(tiny):
    """EOS as the last allowed token is "stop"; one token short of it "length"; max_new_tokens = 1 and 0;
    a resumed prefix one token short of the cap whose next token is EOS; both engines alike."""
    tok, _, model, prompts = tiny
    p = prompts[0]
    free = _argmax_loop(model, p, 12, set())
    k = next(i for i in range(2, 12) if free[i] not in free[:i])  # the first repeat-free token after two
    eos = [free[k]]
    cases = [(k + 1, free[: k + 1], "stop"), (k, free[:k], "length"), (1, free[:1], "length"), (0, [], "length")]
    for eng in (_hf(model, eos, tok.pad_token_id), _cont(model, eos, tok.pad_token_id)):
        outs = eng.generate([GenerationRequest(p, n, greedy=True) for n, _, _ in cases])
        assert [(o.response_ids, o.finish_reason) for o in outs] == [(ids, r) for _, ids, r in cases]
    first = _cont(model, [free[0]], tok.pad_token_id).generate([GenerationRequest(p, 1, greedy=True)])[0]
    assert (first.response_ids, first.finish_reason) == ([free[0]], "stop")  # EOS as the only token
    eng = _cont(model, eos, tok.pad_token_id)
    resumed = eng.generate([GenerationRequest(p, k + 1, greedy=True, prefix_ids=free[:k], prefix_logprobs=[-1.0] * k,
                                              prefix_versions=[0] * k)])[0]
    assert (resumed.response_ids, resumed.finish_reason, resumed.logprobs[:k]) == (free[: k + 1], "stop", [-1.0] * k)


def test_a_prompt_at_the_context_limit(tiny):
    """A prompt filling a learned position table (GPT-2, n_positions = 16) still gets its one new token,
    "length", in both engines; 15 tokens get two."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=16, n_embd=32, n_layer=2, n_head=4, pad_token_id=0,
                                       eos_token_id=1, bos_token_id=1)).eval()
    full = [(3 + 5 * i) % 37 + 3 for i in range(16)]
    for eng in (_hf(model, [1], 0), _cont(model, [1], 0)):
        for prompt, n in ((full, 1), (full[:15], 2)):
            out = eng.generate([GenerationRequest(prompt, n, greedy=True), GenerationRequest(prompt[:3], n, greedy=True)])
            assert [o.response_ids for o in out] == [_argmax_loop(model, q, n, {1}) for q in (prompt, prompt[:3])]
            assert [o.finish_reason for o in out] == ["length", "length"]


@pytest.mark.parametrize("engine", [_hf, _cont])
def test_seeded_sampling_is_reproducible(tiny, engine):
    """Same seed, same tokens and log-probs (another seed, other tokens); a generator handed to generate()
    reproduces its draws and leaves the engine's own stream where it was."""
    tok, _, model, prompts = tiny
    reqs = [GenerationRequest(p, n, temperature=1.0) for p, n in zip(prompts, LIMITS)] * 2

    def run(seed, **kw):
        eng = engine(model, [tok.eos_token_id], tok.pad_token_id, seed=seed, top_k=kw.pop("top_k", 0), **kw)
        return [(o.response_ids, o.logprobs) for o in eng.generate(reqs)], eng

    a, eng = run(5)
    b, _ = run(5)
    c, _ = run(6)
    assert a == b and [x for x, _ in a] != [x for x, _ in c]
    assert run(5, top_k=5)[0] == run(5, top_k=5)[0]
    state = eng.generator.get_state()
    g1 = [o.response_ids for o in eng.generate(reqs, generator=torch.Generator().manual_seed(9))]
    g2 = [o.response_ids for o in eng.generate(reqs, generator=torch.Generator().manual_seed(9))]
    assert g1 == g2 and torch.equal(eng.generator.get_state(), state)


def test_executor_partial_rollouts_are_reproducible(tiny):
    """Two runs of partial rollouts with the same seed (rows kept in their slots, weights changing each
    step) deliver the same samples, versions included."""
    tok, _, model, _ = tiny
    prompts = {f"p{i}": tok(t)["input_ids"] for i, t in enumerate(TEXTS[:6])}
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids("1"), tok.convert_tokens_to_ids("e")]

    def run():
        eng = _cont(model, eos, tok.pad_token_id, batch_size=3, num_slots=3, seed=7)
        ex = RolloutExecutor(eng, prompts, max_new_tokens=16, temperature=1.0, partial=True, retention_limit=3,
                             keep_kv=True)
        got = []
        for step in range(4):
            out = ex.generate([Request(f"p{(2 * step + k) % 6}", 3) for k in range(3)])
            for grp in (out.groups, out.adopted):
                got += [(uid, o.response_ids, o.logprobs, o.versions, o.finish_reason)
                        for uid in sorted(grp) for o in grp[uid]]
            eng.load_weights({k: v + 0.01 for k, v in eng.model.state_dict().items()}, version=step + 1)
        return got

    first = run()
    assert first and first == run()


def test_requests_fed_into_a_running_round_decode_greedily(tiny):
    """Follow-up requests that join a running round (feed) take free slots beside rows mid-way through
    their responses; every response is still the argmax loop's."""
    tok, _, model, prompts = tiny
    eos = [tok.eos_token_id, 9]
    eng = _cont(model, eos, tok.pad_token_id, num_slots=3, batch_size=2)
    queue = [GenerationRequest(p, n, greedy=True, request_id=100 + i) for i, (p, n) in enumerate(zip(prompts, LIMITS))]

    def feed(fin):
        return [queue.pop()] if queue else []

    done, pending = eng.run_round([GenerationRequest(prompts[2], 20, greedy=True, request_id=0)], feed=feed)
    assert not pending and len(done) == len(prompts) + 1
    want = {0: _argmax_loop(model, prompts[2], 20, set(eos))}
    want.update({100 + i: _argmax_loop(model, p, n, set(eos)) for i, (p, n) in enumerate(zip(prompts, LIMITS))})
    assert {o.request_id: o.response_ids for o in done} == want


@pytest.mark.parametrize("keep_kv", [False, True])
def test_carried_samples_finish_as_if_never_interrupted(tiny, keep_kv):
    """Partial rollouts at temperature 0: samples cut at the end of a step's first round and finished in a
    later step (under new version numbers, same weights) equal the argmax loop's, and their versions say
    which step produced each token."""
    tok, _, model, _ = tiny
    prompts = {f"p{i}": tok(t)["input_ids"] for i, t in enumerate(TEXTS)}
    eos = [tok.eos_token_id, 9]
    eng = _cont(model, eos, tok.pad_token_id, batch_size=2, num_slots=2)
    ex = RolloutExecutor(eng, prompts, max_new_tokens=16, temperature=0.0, partial=True, retention_limit=9,
                         stop_fraction=0.34, keep_kv=keep_kv)
    uids, seen, mixed = list(prompts), 0, 0
    for step in range(5):
        out = ex.generate([Request(uids[(2 * step + k) % len(uids)], 1) for k in range(3)] if step < 4 else [])
        for uid, outs in (*out.groups.items(), *out.adopted.items()):
            for o in outs:
                seen += 1
                assert o.response_ids == _argmax_loop(model, prompts[uid], 16, set(eos)), uid
                assert o.versions == sorted(o.versions) and set(o.versions) <= set(range(step + 1))
                mixed += len(set(o.versions)) > 1
        eng.load_weights(model.state_dict(), version=step + 1)
    assert mixed > 0 and seen == ex.totals["delivered"] and seen + ex.buffered() == 12
