import pytest
import torch

from rollwise.engine import GenerationRequest, HFEngine
from rollwise.models import load_model, load_tokenizer
from rollwise.training.logprobs import pack, response_logprobs


def _setup(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir))
    eng = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, dtype=torch.float32, batch_size=4, seed=0)
    return tok, model, eng


def test_greedy_batched_matches_one_at_a_time_and_generate(tiny_model_dir):
    tok, model, eng = _setup(tiny_model_dir)
    prompts = [tok("12+34=")["input_ids"], tok("a much longer prompt: 7*8=")["input_ids"], tok("x")["input_ids"]]
    batched = eng.generate([GenerationRequest(p, 12, greedy=True) for p in prompts])
    for p, out in zip(prompts, batched):
        single = eng.generate([GenerationRequest(p, 12, greedy=True)])[0]
        assert single.response_ids == out.response_ids
        ref = model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
        if tok.eos_token_id in ref:
            ref = ref[: ref.index(tok.eos_token_id) + 1]
        assert out.response_ids == ref


def test_behaviour_logprobs_match_fresh_forward(tiny_model_dir):
    tok, model, eng = _setup(tiny_model_dir)
    prompts = [tok("hello")["input_ids"], tok("9-3=?")["input_ids"]]
    outs = eng.generate([GenerationRequest(p, 10, temperature=0.7) for p in prompts])
    batch = pack(prompts, [o.response_ids for o in outs], tok.pad_token_id)
    with torch.no_grad():
        lp, _ = response_logprobs(model, batch, temperature=0.7, chunk_tokens=3)
    for b, o in enumerate(outs):
        n = len(o.response_ids)
        torch.testing.assert_close(lp[b, :n], torch.tensor(o.logprobs), atol=1e-4, rtol=1e-4)
        assert o.versions == [0] * n
        assert o.finish_reason in ("stop", "length")
        assert (o.finish_reason == "length") == (n == 10 and o.response_ids[-1] != tok.eos_token_id)


def test_sampling_is_seeded(tiny_model_dir):
    tok, model, _ = _setup(tiny_model_dir)
    runs = []
    for seed in (5, 5, 6):
        eng = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, dtype=torch.float32, seed=seed)
        runs.append([o.response_ids for o in eng.generate([GenerationRequest([5, 6, 7], 8)] * 3)])
    assert runs[0] == runs[1] and runs[2] != runs[0]  # the seed, not a fixed one, decides the draws


def test_load_weights_changes_outputs_and_version(tiny_model_dir):
    tok, model, eng = _setup(tiny_model_dir)
    sd = {k: v + 0.5 for k, v in model.state_dict().items()}
    before = eng.generate([GenerationRequest([5, 6, 7], 6, greedy=True)])[0]
    eng.load_weights(sd, version=3)
    after = eng.generate([GenerationRequest([5, 6, 7], 6, greedy=True)])[0]
    assert after.versions == [3] * len(after.response_ids)
    assert after.logprobs != before.logprobs


def test_load_weights_refuses_unknown_missing_or_misshaped_weights(tiny_model_dir):
    tok, model, eng = _setup(tiny_model_dir)
    sd = model.state_dict()
    wrapped = {"base_model.model." + k: v for k, v in sd.items()}  # a LoRA model's names
    with pytest.raises(ValueError, match="does not have.*base_model.model"):
        eng.load_weights(wrapped, version=1)
    partial = {k: v for k, v in sd.items() if "layers.0." not in k}
    with pytest.raises(ValueError, match="parameters are missing"):
        eng.load_weights(partial, version=1)
    k0 = [k for k, v in sd.items() if v.dim() == 2][-1]  # the last key: earlier ones must not be copied either
    before = {k: v.clone() for k, v in eng.model.state_dict().items()}
    with pytest.raises(ValueError, match="shape"):
        eng.load_weights({**{k: v + 1 for k, v in sd.items()}, k0: sd[k0][:, :-1]}, version=1)
    assert eng.version == 0 and all(torch.equal(v, before[k]) for k, v in eng.model.state_dict().items())
    eng.load_weights(sd, version=2)  # the full state dict (tied weights under two names) is accepted
    assert eng.version == 2


def test_chunked_logprobs_equal_full_logsoftmax_and_have_grad(tiny_model_dir):
    tok, model, _ = _setup(tiny_model_dir)
    batch = pack([[5, 6], [7, 8, 9]], [[10, 11, 12], [13]], tok.pad_token_id)
    lp, ent = response_logprobs(model, batch, temperature=1.0, chunk_tokens=2, want_entropy=True)
    full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids).logits
    logsm = torch.log_softmax(full.float(), -1)
    P = batch.prompt_len
    expect0 = torch.stack([logsm[0, P - 1 + i, t] for i, t in enumerate([10, 11, 12])])
    torch.testing.assert_close(lp[0, :3], expect0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lp[1, 0], logsm[1, P - 1, 13], atol=1e-5, rtol=1e-5)
    assert lp[1, 1:].abs().sum() == 0
    ent_expect = -(logsm[0, P - 1].exp() * logsm[0, P - 1]).sum()
    torch.testing.assert_close(ent[0, 0], ent_expect, atol=1e-5, rtol=1e-5)
    lp.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None


def test_finished_rows_leave_the_batch_without_changing_results(tiny_model_dir):
    tok, model, eng = _setup(tiny_model_dir)
    torch.manual_seed(1)
    noisy = load_model(str(tiny_model_dir))
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    eng = HFEngine(noisy, [tok.eos_token_id], tok.pad_token_id, dtype=torch.float32, batch_size=8, seed=0)
    prompts = [tok(s)["input_ids"] for s in ("1+1=", "22*3=", "a b c", "hello there", "9", "x=7;y=")]
    limits = [2, 14, 5, 9, 3, 11]  # rows finish at different steps, so the batch shrinks several times
    batched = eng.generate([GenerationRequest(p, n, greedy=True) for p, n in zip(prompts, limits)])
    for p, n, out in zip(prompts, limits, batched):
        single = eng.generate([GenerationRequest(p, n, greedy=True)])[0]
        assert out.response_ids == single.response_ids
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(single.logprobs), atol=1e-4, rtol=1e-4)
        assert len(out.response_ids) <= n


def test_draw_matches_the_distribution_and_never_picks_zero_mass():
    from rollwise.engine.hf import draw

    gen = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 0.0, 1.0]]).repeat(20000, 1)  # [40000, 4]
    x = draw(probs, gen)
    first = torch.bincount(x[0::2], minlength=4).double() / 20000
    assert first[1] == 0 and torch.all(x[1::2] == 3)
    torch.testing.assert_close(first, torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64), atol=0.015, rtol=0)


def test_transposed_weights_same_values_layout_kept_by_load_weights(tiny_model_dir):
    from rollwise.engine.hf import input_major, transpose_linear_weights

    tok, model, _ = _setup(tiny_model_dir)
    std = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, dtype=torch.float32, seed=0, transpose_weights=False)
    tr = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, dtype=torch.float32, seed=0)  # auto: CPU fp32 -> on
    assert input_major(tr.model) and not input_major(std.model) and not input_major(model)
    for k, v in tr.model.state_dict().items():  # same values under the same names and shapes
        torch.testing.assert_close(v, std.model.state_dict()[k], atol=0, rtol=0)
    emb, head = tr.model.get_input_embeddings(), tr.model.get_output_embeddings()
    assert (emb.weight is head.weight) == (model.get_input_embeddings().weight is model.get_output_embeddings().weight)
    sd = {k: v * 1.01 for k, v in model.state_dict().items()}
    for eng in (std, tr):
        eng.load_weights(sd, version=1)
    assert input_major(tr.model)  # the sync wrote the new values into the input-major copy
    for k, v in tr.model.state_dict().items():
        torch.testing.assert_close(v, sd[k], atol=0, rtol=0)
    ids = torch.tensor([[5, 6, 7, 8], [9, 3, 2, 1]])
    with torch.no_grad():  # equal up to the order fp32 products sum in
        torch.testing.assert_close(tr.model(ids).logits, std.model(ids).logits, atol=1e-4, rtol=1e-4)
    reqs = [GenerationRequest(tok("12+34=")["input_ids"], 10, greedy=True), GenerationRequest([5, 6, 7], 10, greedy=True)]
    a, b = std.generate(reqs), tr.generate(reqs)
    assert [o.response_ids for o in a] == [o.response_ids for o in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=1e-4)
    again = HFEngine(model, [tok.eos_token_id], tok.pad_token_id, dtype=torch.float32, transpose_weights=False)
    assert transpose_linear_weights(again.model) == len({id(m.weight) for m in again.model.modules()
                                                         if isinstance(m, torch.nn.Linear)})


def test_top_k_and_top_p_keep_exactly_the_head_of_the_distribution():
    from rollwise.engine.hf import _filter_logits

    logits = torch.log(torch.tensor([[0.1, 0.5, 0.3, 0.1], [0.25, 0.25, 0.25, 0.25]]))
    kept = lambda out: torch.isfinite(out).tolist()  # noqa: E731
    assert kept(_filter_logits(logits, 0, 1.0)) == [[True] * 4, [True] * 4]  # off: nothing masked
    assert kept(_filter_logits(logits, 1, 1.0))[0] == [False, True, False, False]  # the argmax only
    assert kept(_filter_logits(logits, 2, 1.0))[0] == [False, True, True, False]
    # nucleus: the smallest head whose mass reaches top_p, the token that crosses it kept
    assert kept(_filter_logits(logits, 0, 0.45))[0] == [False, True, False, False]  # 0.5 crosses 0.45
    assert kept(_filter_logits(logits, 0, 0.6))[0] == [False, True, True, False]  # 0.5 + 0.3 crosses 0.6
    assert kept(_filter_logits(logits, 0, 0.85))[0].count(True) == 3  # 0.8, then one of the 0.1s crosses
    assert kept(_filter_logits(logits, 0, 0.6))[1].count(True) == 3  # 0.25 x 3 = 0.75 is the first >= 0.6
    # at an exact boundary the head that holds top_p is the nucleus: 0.25 x 2 = 0.5 (as HF and vLLM; a third
    # token was kept before)
    assert kept(_filter_logits(logits, 0, 0.5))[1].count(True) == 2
    # both: top-k first, then the nucleus of what is left (renormalised: 0.5 / 0.8 = 0.625 >= 0.6)
    assert kept(_filter_logits(logits, 2, 0.6))[0] == [False, True, False, False]
    # the kept logits are unchanged (softmax renormalises them)
    out = _filter_logits(logits, 0, 0.6)
    assert torch.equal(out[0, 1:3], logits[0, 1:3])


@pytest.mark.parametrize("engine", ["hf", "continuous"])
def test_top_k_and_top_p_from_the_config_reach_the_engine(tiny_model_dir, engine):
    """rollout.top_k=1 (or a tiny top_p) samples the argmax: the greedy answer at temperature 1;
    without them, sampling differs from greedy."""
    from rollwise.config import load_config
    from rollwise.engine.factory import build_engine

    tok, model, _ = _setup(tiny_model_dir)
    reqs = [GenerationRequest([5, 6, 7], 8), GenerationRequest([9, 10], 8)] * 2
    greedy = [o.response_ids for o in _setup(tiny_model_dir)[2].generate(
        [GenerationRequest(r.prompt_ids, 8, greedy=True) for r in reqs])]

    def sampled(*overrides):
        cfg = load_config(None, [f"rollout.engine={engine}", "model.dtype=float32", *overrides])
        eng = build_engine(cfg, model, [tok.eos_token_id], tok.pad_token_id, seed=3)
        return [o.response_ids for o in eng.generate(reqs)]

    assert sampled("rollout.top_k=1") == greedy
    assert sampled("rollout.top_p=0.000001") == greedy
    assert sampled() != greedy


def test_a_request_for_no_tokens_gets_none_and_an_empty_prompt_is_refused(tiny_model_dir):
    tok, model, eng = _setup(tiny_model_dir)
    outs = eng.generate([GenerationRequest([5, 6, 7], 0), GenerationRequest([8, 9], 3)])
    assert [len(o.response_ids) for o in outs] == [0, 3]
    with pytest.raises(ValueError, match="empty prompt"):
        eng.generate([GenerationRequest([], 3), GenerationRequest([4, 5], 3)])


def test_hf_engine_refuses_a_request_to_continue_a_partial_response(tiny_model_dir):
    """The hf engine starts every response from its prompt: a request carrying prefix_ids is refused,
    not generated as if the prefix were not there."""
    tok, model, eng = _setup(tiny_model_dir)
    resumed = GenerationRequest([5, 6, 7], 6, prefix_ids=[8, 9], prefix_logprobs=[-1.0, -1.0], prefix_versions=[0, 0])
    with pytest.raises(ValueError, match=r"1 generation request\(s\) carry a partial response \(prefix_ids\)"):
        eng.generate([GenerationRequest([4, 5], 3), resumed])
