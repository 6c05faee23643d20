"""The rollout executor on a tiny model: partial rollouts account for every sample, and
speculative reuse keeps the new policy's distribution (statistically, at lenience 1)."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch

from rollwise.engine import GenerationRequest
from rollwise.engine.continuous import ContinuousEngine, unpack_topk
from rollwise.engine.executor import RolloutExecutor
from rollwise.models import load_model, load_tokenizer
from rollwise.planner.base import Request

TEXTS = ["12+34=", "a longer prompt: 7*8=", "x", "hello there", "9-3=?", "what is 2*21? answer:"]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


def _perturbed(tiny_model_dir, scale, seed):
    model = load_model(str(tiny_model_dir))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel() + seed)))
    return model


def _engine(model, tok, eos, slots=3, topk=0, seed=0):
    return ContinuousEngine(model, eos, tok.pad_token_id, dtype=torch.float32, batch_size=slots, seed=seed,
                            num_slots=slots, record_topk=topk)


@pytest.mark.parametrize(("retention", "keep_kv"), [(0, False), (1, False), (5, False), (5, True)])
def test_partial_rollouts_account_for_every_sample(tiny_model_dir, tok, retention, keep_kv):
    model = _perturbed(tiny_model_dir, 0.3, 0)
    prompts = {f"p{i}": tok(t)["input_ids"] for i, t in enumerate(TEXTS)}
    # a frequent character as a second EOS makes lengths vary between 1 and the cap
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids("1"), tok.convert_tokens_to_ids("e")]
    eng = _engine(model, tok, eos)
    ex = RolloutExecutor(eng, prompts, max_new_tokens=24, temperature=1.0, partial=True, retention_limit=retention,
                         keep_kv=keep_kv)
    delivered, mixed_versions, held = 0, 0, 0
    uids = list(prompts)
    for step in range(6):
        reqs = [Request(uids[(3 * step + k) % 6], 3 - k % 2) for k in range(3)]
        before = len(ex.carried)
        out = ex.generate(reqs, first_round=True)
        held += bool(eng._held) and ex.buffered() > 0  # carried rows kept in their slots between steps
        assert len(out.groups) + len(out.adopted) >= math.floor(0.75 * (len(reqs) + before)) - before  # stop rule
        for grp in (out.groups, out.adopted):
            for outs in grp.values():
                delivered += len(outs)
                for o in outs:
                    assert len(o.response_ids) == len(o.logprobs) == len(o.versions) >= 1
                    assert eng.version - min(o.versions) <= retention + 1  # the retention limit holds
                    mixed_versions += len(set(o.versions)) > 1
        ex.metrics()
        eng.load_weights(eng.model.state_dict(), version=step + 1)
    t = ex.totals
    assert t["requested"] == 6 * 8 and t["delivered"] == delivered
    assert t["requested"] == t["delivered"] + ex.buffered() + t["dropped_stale"]
    assert ex.buffered() + t["dropped_stale"] + mixed_versions > 0  # partial rollouts really happened
    if retention == 0:
        assert mixed_versions == 0  # a carried sample is one version old at the next step: dropped
    if retention == 1:
        assert mixed_versions > 0  # one version old: resumed, not dropped
    if retention == 5:
        assert t["dropped_stale"] == 0 and mixed_versions > 0  # resumed samples hold tokens of two versions
    assert (held > 0) == keep_kv  # carried rows stay in their slots only with partial_keep_kv


def test_rows_held_by_a_partial_first_round_survive_a_follow_up_round(tiny_model_dir, tok):
    """partial_keep_kv: a follow-up round of the same step (a planner's top-up) leaves the rows the
    first round held in their slots for the next step, instead of dropping them."""
    model = _perturbed(tiny_model_dir, 0.3, 0)
    prompts = {f"p{i}": tok(t)["input_ids"] for i, t in enumerate(TEXTS)}
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids("1"), tok.convert_tokens_to_ids("e")]  # lengths vary
    eng = _engine(model, tok, eos, slots=3)
    ex = RolloutExecutor(eng, prompts, max_new_tokens=24, temperature=1.0, partial=True, retention_limit=5,
                         keep_kv=True, stop_fraction=0.5)
    ex.generate([Request(u, 2) for u in list(prompts)[:4]], first_round=True)
    assert ex.carried and eng._held is not None and eng._held.rows
    held = {row.req.request_id for row in eng._held.rows}
    ex.generate([Request(list(prompts)[5], 2)], first_round=False)  # a top-up of the same step
    assert eng._held is not None and {row.req.request_id for row in eng._held.rows} == held
    prefilled = eng.stats["prefill_tokens"]
    fresh = sum(len(q.prompt_ids) for g in ex.carried.values() for q in g.pending if not q.prefix_ids)
    ex.generate([], first_round=True)  # the next step: the held rows go on in their slots, not prefilled again
    assert eng.stats["prefill_tokens"] - prefilled <= fresh


def test_partial_stop_fraction_sets_how_many_groups_end_the_first_round(tiny_model_dir, tok):
    model = _perturbed(tiny_model_dir, 0.3, 0)
    prompts = {f"p{i}": tok(t)["input_ids"] for i, t in enumerate(TEXTS)}
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids("1"), tok.convert_tokens_to_ids("e")]
    reqs = [Request(u, 3) for u in list(prompts)[:3]]
    done = {}
    for fraction in (1.0, 1 / 3):
        ex = RolloutExecutor(_engine(model, tok, eos), prompts, 24, 1.0, partial=True, stop_fraction=fraction)
        out = ex.generate(reqs, first_round=True)
        done[fraction] = (len(out.groups), ex.buffered())
    assert done[1.0] == (3, 0)  # every group finished, nothing carried
    assert done[1 / 3][0] >= 1 and done[1 / 3][1] > 0  # one group ends the round; the rest is carried


def test_executor_state_round_trips(tiny_model_dir, tok):
    model = _perturbed(tiny_model_dir, 0.3, 0)
    prompts = {f"p{i}": tok(t)["input_ids"] for i, t in enumerate(TEXTS)}
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids("1")]
    ex = RolloutExecutor(_engine(model, tok, eos), prompts, 24, 1.0, partial=True, speculative=True)
    ex.generate([Request("p0", 3), Request("p1", 3), Request("p2", 3)])
    ex2 = RolloutExecutor(_engine(model, tok, eos), prompts, 24, 1.0, partial=True, speculative=True)
    ex2.load_state_dict(ex.state_dict())
    assert ex2.buffered() == ex.buffered() and ex2.totals == ex.totals and ex2.bank.keys() == ex.bank.keys()


def test_speculative_reuse_with_unchanged_weights_reuses_almost_everything(tiny_model_dir, tok):
    model = _perturbed(tiny_model_dir, 0.3, 0)
    prompts = {f"p{i}": tok(t)["input_ids"] for i, t in enumerate(TEXTS)}
    eng = _engine(model, tok, [tok.eos_token_id], slots=8, topk=8)
    ex = RolloutExecutor(eng, prompts, 16, 1.0, speculative=True, lenience=1.0)
    reqs = [Request(u, 4) for u in prompts]
    ex.generate(reqs)
    first = ex.step_tokens()
    ex.metrics()
    sampled = eng.stats["sampled_tokens"]
    out = ex.generate(reqs)
    st = eng.stats
    assert st["spec_candidates"] == 24 and st["spec_accepted_tokens"] >= 0.95 * st["spec_old_tokens"]
    assert ex.step_tokens() < 0.2 * first  # only rejected tails are generated again
    assert ex.step_tokens() == st["sampled_tokens"] - sampled
    # under other weights responses are rejected part-way: the token verify draws there counts too
    eng.load_weights(_perturbed(tiny_model_dir, 0.6, 5).state_dict(), version=1)
    ex.metrics()
    sampled = eng.stats["sampled_tokens"]
    ex.generate(reqs)
    assert eng.stats["spec_accepted_tokens"] < eng.stats["spec_old_tokens"]  # some were rejected
    assert ex.step_tokens() == eng.stats["sampled_tokens"] - sampled
    assert all(len(v) == 4 for v in out.groups.values())
    for outs in out.groups.values():
        for o in outs:  # one top-k per token, packed into two [L, K] CPU tensors
            ids, probs = o.topk
            assert ids.shape[0] == probs.shape[0] == len(o.response_ids) == len(o.logprobs)
            assert ids.device.type == "cpu" and ids.dtype == torch.int32 and probs.dtype == torch.float16
            assert len(unpack_topk(o.topk)) == len(o.response_ids)


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09: p = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _chi2(tokens: list[int], probs: torch.Tensor) -> tuple[float, int]:
    counts = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).double()
    expected = probs.double() * len(tokens)
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


def test_verify_at_lenience_one_samples_the_new_policy(tiny_model_dir, tok, monkeypatch):
    """Old responses from one model, verified under another: the first token of what comes back is
    distributed as the new model's first-token distribution (chi-square, p = 0.001). SPEC-RL's
    shortcut (resample a rejected token from the full new distribution) fails the same test."""
    old_model = _perturbed(tiny_model_dir, 0.6, 3)
    new_model = _perturbed(tiny_model_dir, 0.6, 3)  # the same, plus a small step: the two overlap in part
    with torch.no_grad():
        for p in new_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel() + 99)))
    prompt = tok("12+34=")["input_ids"]
    V = new_model.config.vocab_size
    old_eng = _engine(old_model, tok, [tok.eos_token_id], slots=256, topk=V, seed=1)
    n = 4000
    olds = old_eng.generate([GenerationRequest(prompt, 2, 1.0) for _ in range(n)])
    with torch.no_grad():
        p_new = torch.softmax(new_model(torch.tensor([prompt])).logits[0, -1].double(), -1)  # [V]
        p_old = torch.softmax(old_model(torch.tensor([prompt])).logits[0, -1].double(), -1)
    assert 0.2 < 0.5 * (p_new - p_old).abs().sum() < 0.6  # the policies differ: rejections are frequent

    def first_tokens(seed):
        eng = _engine(new_model, tok, [tok.eos_token_id], slots=256, topk=V, seed=seed)
        items = eng.verify([prompt] * n, olds, lenience=1.0, temperature=1.0, max_new_tokens=2)
        return [(it.response_ids if hasattr(it, "response_ids") else it.prefix_ids)[0] for it in items]

    stat, df = _chi2(first_tokens(3), p_new)
    assert stat < _chi2_critical(df), (stat, df)
    import rollwise.engine.continuous as engine_module

    monkeypatch.setattr(engine_module, "residual_distribution", lambda p_new, p_old, lenience=1.0: p_new)
    stat_bad, df_bad = _chi2(first_tokens(3), p_new)
    assert stat_bad > _chi2_critical(df_bad), (stat_bad, df_bad)


def test_overlapped_rounds_hand_out_groups_as_they_finish_and_take_follow_ups(tiny_model_dir, tok):
    model = _perturbed(tiny_model_dir, 0.3, 0)
    prompts = {f"p{i}": tok(t)["input_ids"] for i, t in enumerate(TEXTS)}
    eos = [tok.eos_token_id, tok.convert_tokens_to_ids("1"), tok.convert_tokens_to_ids("e")]  # lengths vary
    eng = _engine(model, tok, eos, slots=4)
    ex = RolloutExecutor(eng, prompts, max_new_tokens=24, temperature=1.0)
    assert ex.streams
    calls: list[dict[str, int]] = []
    topped: set[str] = set()

    def on_groups(out):
        assert not out.adopted
        calls.append({u: len(v) for u, v in out.groups.items()})
        for outs in out.groups.values():
            assert all(len(o.response_ids) == len(o.logprobs) == len(o.versions) >= 1 for o in outs)
        fresh = [u for u in out.groups if u not in topped]  # every group once gets a top-up of 2
        topped.update(fresh)
        return [Request(u, 2) for u in fresh]

    out = ex.generate([Request(u, 3) for u in prompts], on_groups=on_groups)
    assert out.groups == {} and out.adopted == {}  # everything went through on_groups
    delivered: dict[str, list[int]] = {}
    for c in calls:
        for u, k in c.items():
            delivered.setdefault(u, []).append(k)
    assert delivered == {u: [3, 2] for u in prompts}
    assert len(calls) > 2  # groups were handed out as they finished, not all at the end
    t = ex.totals
    assert t["requested"] == t["delivered"] == 6 * 5 and ex.buffered() == 0
    m = ex.metrics()
    assert m["rollout/engine_rounds"] == 1  # the top-ups joined the running round


def test_overlapped_rounds_refuse_partial_rollouts(tiny_model_dir, tok):
    model = _perturbed(tiny_model_dir, 0.3, 0)
    prompts = {"p0": tok("x")["input_ids"]}
    ex = RolloutExecutor(_engine(model, tok, [tok.eos_token_id]), prompts, 8, 1.0, partial=True)
    assert not ex.streams
    with pytest.raises(ValueError, match="partial rollouts"):
        ex.generate([Request("p0", 2)], on_groups=lambda out: [])


def test_speculative_reuse_draws_on_the_bank_only_in_a_steps_first_round(tiny_model_dir, tok):
    # a top-up round in the same step must not re-verify this step's own responses (under the same
    # weights they would all be accepted: copies of the samples the planner just saw)
    model = _perturbed(tiny_model_dir, 0.3, 0)
    prompts = {f"p{i}": tok(t)["input_ids"] for i, t in enumerate(TEXTS[:3])}
    eng = _engine(model, tok, [tok.eos_token_id], slots=8, topk=8)
    ex = RolloutExecutor(eng, prompts, 16, 1.0, speculative=True)
    reqs = [Request(u, 2) for u in prompts]
    first = ex.generate(reqs, first_round=True)
    top_up = ex.generate(reqs, first_round=False)
    assert eng.stats["spec_candidates"] == 0
    copies = sum(a.response_ids == b.response_ids for u in prompts for a, b in zip(first.groups[u], top_up.groups[u]))
    assert copies < 6
    # the next step's first round does reuse them: the first round's responses only, 2 per prompt (a follow-up
    # round is asked for because of the first round's rewards: its responses would tilt the bank toward them)
    ex.generate([Request(u, 4) for u in prompts], first_round=True)
    assert eng.stats["spec_candidates"] == 6


class _Scripted:
    """Sample k of the engine's life is one token, k + 10 (its id tells the round it came from)."""

    version = 0

    def __init__(self):
        self.k = 0

    def run_round(self, reqs, stop_when=None, token_budget=None, hold=False, feed=None, generator=None):
        from rollwise.engine.hf import GenerationOutput

        outs = []
        for q in reqs:
            outs.append(GenerationOutput([self.k + 10], [-0.1], [0], "stop", request_id=q.request_id))
            self.k += 1
        return outs, []

    def verify(self, prompts, olds, lenience, temperature, max_new):
        return [o for o in olds]


def test_speculative_reuse_banks_a_steps_first_round_only():
    """Stages that stop at the first correct response (ar3po), top-ups and growth are asked for because of the
    first round's rewards: a bank holding their responses draws the outcome that asked for them more often than
    the policy does. The first round's responses (reused ones included) are a plain draw; only they are banked."""
    ex = RolloutExecutor(_Scripted(), {"a": [1], "b": [1]}, 4, 1.0, speculative=True)
    ex.generate([Request("a", 2), Request("b", 1)], first_round=True)  # tokens 10, 11 | 12
    ex.generate([Request("a", 3)], first_round=False)  # a follow-up: 13, 14, 15
    assert {u: [o.response_ids[0] for o in v] for u, v in ex.bank.items()} == {"a": [10, 11], "b": [12]}
    # the next step reuses the bank whole and samples the rest; the reused ones stay in the bank
    out = ex.generate([Request("a", 3)], first_round=True)
    assert sorted(o.response_ids[0] for o in out.groups["a"]) == [10, 11, 16]
    assert sorted(o.response_ids[0] for o in ex.bank["a"]) == [10, 11, 16] and ex.bank["b"][0].response_ids == [12]


def test_a_carried_group_from_a_checkpoint_before_first_round_ids_is_banked_whole():
    from rollwise.engine.executor import _Group
    from rollwise.engine.hf import GenerationOutput

    ex = RolloutExecutor(_Scripted(), {"a": [1]}, 4, 1.0, speculative=True)
    g = _Group("a", expected=2, done=[GenerationOutput([7], [-0.1], [0], "stop", request_id=3)],
               pending=[GenerationRequest([1], 4, request_id=4)], carried=True)
    del g.first_ids  # as unpickled from an older checkpoint
    ex.load_state_dict({"carried": {"a": g}, "bank": {}, "totals": ex.totals})
    out = ex.generate([], first_round=True)
    assert [o.response_ids[0] for o in out.adopted["a"]] == [7, 10]
    assert [o.response_ids[0] for o in ex.bank["a"]] == [7, 10]


def test_a_group_is_delivered_in_the_order_its_samples_were_requested_not_finished():
    from rollwise.engine.hf import GenerationOutput

    class LongFirst:
        """Sample k of a round is 10 - k tokens long, and the engine hands them back shortest first."""

        version = 0

        def run_round(self, reqs, stop_when=None, token_budget=None, hold=False, feed=None, generator=None):
            outs = [GenerationOutput([5] * (10 - k), [-0.1] * (10 - k), [0] * (10 - k), "stop", request_id=q.request_id)
                    for k, q in enumerate(reqs)]
            return sorted(outs, key=lambda o: len(o.response_ids)), []

    ex = RolloutExecutor(LongFirst(), {"a": [1]}, max_new_tokens=16, temperature=1.0)
    out = ex.generate([Request("a", 4)], first_round=True)
    assert [len(o.response_ids) for o in out.groups["a"]] == [10, 9, 8, 7]


class _Idle:
    """An engine stand-in with nothing to generate (the executor checks for run_round)."""

    version = 0

    def run_round(self, reqs, **kw):
        return [], []


def test_speculative_reuse_draws_from_a_bank_larger_than_the_request_at_random():
    ex = RolloutExecutor(_Idle(), {"a": [1]}, 16, 1.0, speculative=True)
    ex.bank["a"] = list(range(8))  # stand-ins for 8 banked responses, those reused whole first
    assert ex._from_bank("a", 8) == list(range(8)) and ex._from_bank("b", 2) == []
    picks = set()
    for k in range(40):
        ex._next_id = k
        got = ex._from_bank("a", 2)
        assert got == ex._from_bank("a", 2) and len(set(got)) == 2  # reproducible, no response twice
        picks.update(got)
    assert picks == set(range(8))  # not always the first two
    # and generate() verifies that draw: a bank of 8 responses, a request of 2
    from rollwise.engine.hf import GenerationOutput

    class Verifying(_Idle):
        def verify(self, prompts, olds, lenience, temperature, max_new):
            self.seen = list(olds)
            return [GenerationOutput(list(o.response_ids), list(o.logprobs), list(o.versions), "stop") for o in olds]

    eng = Verifying()
    ex = RolloutExecutor(eng, {"a": [1]}, 16, 1.0, speculative=True)
    ex.bank["a"] = [GenerationOutput([5] * (k + 1), [-0.1] * (k + 1), [0] * (k + 1), "stop", request_id=k) for k in range(8)]
    for k in range(40):  # a request counter whose draw is not the first two
        ex._next_id = k
        if [o.request_id for o in ex._from_bank("a", 2)] != [0, 1]:
            break
    expected = ex._from_bank("a", 2)
    assert [o.request_id for o in expected] != [0, 1]
    ex.generate([Request("a", 2)], first_round=True)
    assert eng.seen == expected


def test_the_rate_behind_spec_saved_s_survives_a_checkpoint():
    ex = RolloutExecutor(_Idle(), {"a": [1]}, 16, 1.0, speculative=True)
    ex._s_per_token = 0.01
    again = RolloutExecutor(_Idle(), {"a": [1]}, 16, 1.0, speculative=True)
    again.load_state_dict(ex.state_dict())
    assert again._s_per_token == 0.01  # a resumed step that reuses everything is not priced at 0 s a token


def test_carried_partial_samples_restart_from_the_prompt_on_an_engine_that_cannot_continue_them(capsys):
    """A checkpoint of a partial-rollouts run resumed with rollout.engine=hf: the HF engine ignores a
    request's prefix, so the executor restarts those samples from the prompt and says so, instead of
    handing the engine prefixes it drops without a word."""
    from rollwise.engine.hf import GenerationOutput

    class PrefixCutter:
        """Hands back each request cut to 3 of its prefix tokens plus 2 new ones (run_round), like the
        continuous engine stopping a round early."""

        version = 0

        def run_round(self, reqs, stop_when=None, token_budget=None, hold=False, feed=None, generator=None):
            return [], [replace(q, prefix_ids=[7, 7, 7], prefix_logprobs=[-0.1] * 3, prefix_versions=[0] * 3)
                        for q in reqs]

    class Whole:
        """The HF engine's interface: generate() only; it records the prefixes it was handed."""

        version = 1

        def __init__(self):
            self.prefixes = []

        def generate(self, reqs, generator=None):
            self.prefixes += [list(q.prefix_ids) for q in reqs]
            return [GenerationOutput([5, 5], [-0.1, -0.1], [1, 1], "stop") for _ in reqs]

    ex = RolloutExecutor(PrefixCutter(), {"a": [1]}, 16, 1.0, partial=True)
    ex.generate([Request("a", 4)], first_round=True)
    assert ex.buffered() == 4
    eng = Whole()
    resumed = RolloutExecutor(eng, {"a": [1]}, 16, 1.0)
    resumed.load_state_dict(ex.state_dict())
    assert "restart from the prompt" in capsys.readouterr().err
    out = resumed.generate([], first_round=True)
    assert eng.prefixes == [[]] * 4  # nothing handed over to be dropped silently
    assert [len(o.response_ids) for o in out.adopted["a"]] == [2] * 4
    assert resumed.totals["requested"] == resumed.totals["delivered"]


def test_carried_samples_continue_under_the_cap_and_temperature_a_resume_sets():
    """Lowering rollout.max_completion_length is the advice for running out of memory; carried samples
    kept the old cap (and temperature) and came back longer than the new one."""
    from rollwise.engine.hf import GenerationOutput

    class Cutter:
        version = 0

        def run_round(self, reqs, stop_when=None, token_budget=None, hold=False, feed=None, generator=None):
            done = [GenerationOutput([5] * 30, [-0.1] * 30, [0] * 30, "stop", request_id=reqs[0].request_id)]
            return done, [replace(q, prefix_ids=[7] * 20, prefix_logprobs=[-0.1] * 20, prefix_versions=[0] * 20)
                          for q in reqs[1:]]

    ex = RolloutExecutor(Cutter(), {"a": [1]}, 40, 1.0, partial=True)
    ex.generate([Request("a", 3)], first_round=True)
    resumed = RolloutExecutor(Cutter(), {"a": [1]}, 8, 0.7, partial=True)
    resumed.load_state_dict(copy.deepcopy(ex.state_dict()))  # as a checkpoint loads it: its own objects
    g = resumed.carried["a"]
    assert [len(o.response_ids) for o in g.done] == [8] and g.done[0].finish_reason == "length"
    assert [(q.max_new_tokens, q.temperature, len(q.prefix_ids)) for q in g.pending] == [(8, 0.7, 8)] * 2
    again = RolloutExecutor(Cutter(), {"a": [1]}, 40, 1.0, partial=True)  # nothing changed: nothing cut
    again.load_state_dict(copy.deepcopy(ex.state_dict()))
    assert [len(q.prefix_ids) for q in again.carried["a"].pending] == [20, 20]


def test_a_prompt_first_asked_in_a_later_round_banks_that_request():
    """DAPO's back-fill asks new prompts in a follow-up round: because of other prompts' rewards, not their own, so
    their groups are a plain draw and are banked; emptying their bank lost their older responses."""
    ex = RolloutExecutor(_Scripted(), {"a": [1], "b": [1]}, 4, 1.0, speculative=True)
    ex.generate([Request("a", 2), Request("b", 2)], first_round=True)  # a: 10, 11 | b: 12, 13
    ex.generate([Request("a", 2)], first_round=True)  # step 2: a reuses its bank whole
    ex.generate([Request("b", 2)], first_round=False)  # b back-filled in step 2: reused? no, sampled: 14, 15
    ex.generate([Request("b", 1)], first_round=False)  # then a top-up of b: 16, not banked
    assert sorted(o.response_ids[0] for o in ex.bank["b"]) == [14, 15]
    assert sorted(o.response_ids[0] for o in ex.bank["a"]) == [10, 11]
