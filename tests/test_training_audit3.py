"""Audit of the policy update against plain references written out here: per-token log-probs against a plain
full forward in every layout, gradient accumulation, zero-advantage skipping, several updates per batch, the
KL term, and gradient clipping."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.testing import assert_close

from rollwise import algos
from rollwise.config import load_config
from rollwise.models import apply_lora, load_model
from rollwise.training import policy
from rollwise.training.logprobs import SharedPromptBatch
from rollwise.training.policy import PolicyTrainer
from rollwise.types import Sample

T = 0.7  # a rollout temperature other than 1: the trainer's log-probs are of the T-scaled distribution


def _samples(seed: int = 0) -> list[Sample]:
    """Groups sharing a prompt (prompts of several lengths: left padding), responses of mixed lengths (right
    padding), one group whose rewards are all equal (advantage exactly 0) and a singleton (advantage 0)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for uid, plen, rewards in (("a", 5, [1.0, 0.0, 0.0, 1.0]), ("b", 9, [1.0, 0.0, 0.5]), ("c", 2, [0.0, 0.0, 0.0]),
                               ("d", 4, [1.0]), ("e", 7, [0.0, 1.0])):
        p = torch.randint(4, 90, (plen,), generator=g).tolist()
        for _ in rewards:
            n = int(torch.randint(1, 9, (1,), generator=g))
            resp = torch.randint(4, 90, (n,), generator=g).tolist()
            out.append(Sample(uid, 0, p, resp, [-4.6] * n, [0] * n, "stop"))
        for s, r in zip(out[-len(rewards):], rewards):
            s.reward = r
    return out


def _model(model_dir, lora: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    model = load_model(str(model_dir))
    if lora:
        cfg = load_config(None, ["model.lora.enabled=true", "model.lora.r=4", "model.lora.target_modules=[q_proj, v_proj, up_proj]"])
        model = apply_lora(model, cfg.model)
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:  # B starts at 0: make the adapters matter
                    p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


def _trainer(model_dir, overrides, lora=False):
    ov = ["model.dtype=float32", f"rollout.temperature={T}", "train.max_grad_norm=1e9", "train.warmup_steps=0",
          *(["model.lora.enabled=true"] if lora else []), *overrides]
    model = _model(model_dir, lora)
    return PolicyTrainer(load_config(None, ov), model, pad_id=0), model


def _run(model_dir, overrides, samples=None, lora=False):
    """(gradients at each optimizer step, metrics, samples, trainer)."""
    tr, model = _trainer(model_dir, overrides, lora)
    grads = []
    step = tr.optimizer.step
    tr.optimizer.step = lambda: (grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                                               if p.grad is not None}), step())
    samples = _samples() if samples is None else samples
    tr.compute_advantages(samples)
    m = tr.update(samples)
    return grads, m, samples, tr


@torch.no_grad()
def _plain_logprobs(model, prompt, response, temperature=T):
    """log softmax(logits / T) of one unpadded prompt + response sequence, at each response token."""
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float() / temperature  # [P + R, V]
    ls = torch.log_softmax(logits, dim=-1)
    return torch.stack([ls[len(prompt) - 1 + t, tok] for t, tok in enumerate(response)])


def _rows(batch):
    """(prompt, response) token lists of each row of a packed or shared batch."""
    out = []
    for b in range(batch.response_ids.shape[0]):
        n = int(batch.response_mask[b].sum())
        if isinstance(batch, SharedPromptBatch):
            k = int(batch.row_prompt[b])
            p = batch.prompt_ids[k][batch.prompt_mask[k].bool()].tolist()
        else:
            P = batch.prompt_len
            p = batch.input_ids[b, :P][batch.attention_mask[b, :P].bool()].tolist()
        out.append((p, batch.response_ids[b, :n].tolist()))
    return out


LAYOUTS = list(itertools.product([False, True], [False, True], [False, True], [1, 3, 1024]))


@pytest.mark.parametrize("lora,share,ckpt,chunk", LAYOUTS)
def test_the_updates_logprobs_are_a_plain_forwards_at_the_rollout_temperature(tiny_model_dir, monkeypatch, lora,
                                                                                share, ckpt, chunk):
    seen = []
    real = policy.response_logprobs

    def spy(model, batch, *a, **k):
        lp, ent = real(model, batch, *a, **k)
        seen.append((batch, lp.detach().clone(), torch.is_grad_enabled()))
        return lp, ent

    monkeypatch.setattr(policy, "response_logprobs", spy)
    ov = [f"train.share_prompt_forward={str(share).lower()}", f"train.gradient_checkpointing={str(ckpt).lower()}",
          f"train.logprob_chunk={chunk}", "train.micro_batch_size=4", "train.skip_zero_advantage=false"]
    _, _, samples, tr = _run(tiny_model_dir, ov, lora=lora)
    assert tr.share_prompts is (share and not ckpt)
    if share and not ckpt:
        assert any(isinstance(b, SharedPromptBatch) for b, _, _ in seen)
    ref = _model(tiny_model_dir, lora).eval()  # the weights before the update
    trained = [b for b in seen if b[2]]
    assert sum(b.response_ids.shape[0] for b, _, _ in trained) == len(samples)
    for batch, lp, _ in trained:
        for b, (p, r) in enumerate(_rows(batch)):
            assert_close(lp[b, : len(r)], _plain_logprobs(ref, p, r), atol=2e-5, rtol=1e-5)
            assert (lp[b, len(r):] == 0).all()


def _pg_reference_grads(model_dir, samples, loss_type, lora=False):
    """The on-policy gradient of the whole batch's loss, one plain forward per sample, written out by hand."""
    model = _model(model_dir, lora)
    model.train()
    rows = [s for s in samples if not s.stop_gradient]
    total = 0.0
    n_tok = sum(len(s.response_ids) for s in rows)
    for s in rows:
        logits = model(input_ids=torch.tensor([s.prompt_ids + s.response_ids])).logits[0].float() / T
        ls = torch.log_softmax(logits, -1)
        lp = torch.stack([ls[len(s.prompt_ids) - 1 + t, tok] for t, tok in enumerate(s.response_ids)])
        ratio = torch.exp(lp - lp.detach())
        per_tok = -s.advantage * ratio
        if loss_type == "dapo":
            total = total + per_tok.sum() / n_tok
        elif loss_type == "grpo":
            total = total + per_tok.mean() / len(rows)
        else:
            total = total + per_tok.sum() / (len(rows) * 48)
    total.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _same_update(a, b, what, lr=3e-5):
    """AdamW's first step moves each weight by about lr x sign(g): an entry whose gradient is as small as Adam's eps
    (1e-8) moves by a fraction of lr that float rounding of g changes, any other by the same amount."""
    for k in a:
        diff = (a[k].detach() - b[k].detach()).abs()
        assert float(diff.max()) < 0.5 * lr and float((diff > 3e-3 * lr).float().mean()) < 1e-2, \
            (what, k, float(diff.max()))


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_gradient_accumulation_gives_the_whole_batchs_gradient_and_update(tiny_model_dir, loss_type):
    ov = [f"algo.loss_type={loss_type}", "rollout.max_completion_length=48", "train.skip_zero_advantage=false"]
    n = len(_samples())
    params = {}
    for mb in (1, 2, 5, n):
        grads, m, samples, tr = _run(tiny_model_dir, [*ov, f"train.micro_batch_size={mb}"])
        params[mb] = ({k: v.detach().clone() for k, v in tr.model.named_parameters()}, grads[0], m)
    ref = _pg_reference_grads(tiny_model_dir, samples, loss_type)
    base_params, base_grads, base_m = params[n]
    for k in ref:
        assert_close(base_grads[k], ref[k], atol=1e-6, rtol=1e-4, msg=k)
    for mb, (p, g, m) in params.items():
        assert m["loss/policy"] == pytest.approx(base_m["loss/policy"], rel=1e-5, abs=1e-7)
        assert m["train/grad_norm"] == pytest.approx(base_m["train/grad_norm"], rel=1e-4)
        for k in ref:
            assert_close(g[k], ref[k], atol=1e-6, rtol=1e-4, msg=f"mb={mb} {k}")
        _same_update(p, base_params, f"mb={mb}")


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
@pytest.mark.parametrize("mb", [1, 3])
def test_skipping_zero_advantage_samples_changes_neither_gradient_nor_update(tiny_model_dir, loss_type, mb):
    ov = [f"algo.loss_type={loss_type}", f"train.micro_batch_size={mb}", "algo.num_iterations=2",
          "train.learning_rate=1e-3"]
    g_skip, m_skip, samples, tr_skip = _run(tiny_model_dir, [*ov, "train.skip_zero_advantage=true"])
    g_all, m_all, _, tr_all = _run(tiny_model_dir, [*ov, "train.skip_zero_advantage=false"])
    zero = sum(s.advantage == 0.0 for s in samples)
    assert zero == 5  # group c, the singleton d and b's middle sample
    assert m_skip["train/skipped_zero_adv"] == zero and m_all["train/skipped_zero_adv"] == 0
    assert len(g_skip) == len(g_all) == 2
    for it in range(2):
        for k in g_all[it]:
            assert_close(g_skip[it][k], g_all[it][k], atol=1e-6, rtol=1e-4, msg=f"{it} {k}")
    assert m_skip["loss/policy"] == pytest.approx(m_all["loss/policy"], rel=1e-5, abs=1e-7)
    _same_update(dict(tr_skip.model.named_parameters()), dict(tr_all.model.named_parameters()), "skip", lr=1e-3)


def test_several_updates_per_batch_keep_the_first_passes_logprobs_as_old(tiny_model_dir, monkeypatch):
    calls = []
    real = algos.get_policy_loss

    def wrapped(name):
        fn = real(name)

        def loss(logp, old, *a, **k):
            calls.append((logp.detach().clone(), old.detach().clone()))
            return fn(logp, old, *a, **k)
        return loss

    monkeypatch.setattr(policy.algos, "get_policy_loss", wrapped)
    ov = ["algo.num_iterations=3", "train.micro_batch_size=4", "train.learning_rate=0.02", "algo.epsilon=0.01",
          "algo.epsilon_high=0.01"]
    grads, m, samples, tr = _run(tiny_model_dir, ov)
    nmb = len(calls) // 3
    first = calls[:nmb]
    for lp, old in first:
        assert torch.equal(lp, old)  # ratio exactly 1 on the first update
    for it in (1, 2):
        for (lp, old), (lp0, _) in zip(calls[it * nmb:(it + 1) * nmb], first):
            assert torch.equal(old, lp0)  # the old log-probs stay the first pass's
            assert not torch.equal(lp, lp0)
    assert m["loss/clip_frac"] > 0 and len(grads) == 3


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("lora,ckpt", [(False, False), (False, True), (True, False), (True, True)])
def test_kl_term_is_the_named_estimator_against_the_references_logprobs_of_the_same_tokens(tiny_model_dir, estimator,
                                                                                          lora, ckpt):
    ov = ["train.micro_batch_size=3", "train.skip_zero_advantage=false", f"algo.kl_estimator={estimator}",
          f"train.gradient_checkpointing={str(ckpt).lower()}"]
    tr, model = _trainer(tiny_model_dir, [*ov, "algo.beta=0.1"], lora)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a policy that has moved away from the reference
        if lora:
            ref_model = None
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.add_(0.3 * torch.randn(p.shape, generator=g))
        else:
            ref_model = tr.ref_model
            for p in ref_model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    grads = []
    tr.optimizer.step = lambda: grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                                              if p.grad is not None})
    samples = _samples()
    tr.compute_advantages(samples)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    m = tr.update(samples)
    # by hand: a fresh copy of the policy's start weights, the reference's log-probs from its own forward
    pol = _model(tiny_model_dir, lora)
    with torch.no_grad():
        for n, p in pol.named_parameters():
            p.copy_(start[n])
    pol.train()
    n_tok = sum(len(s.response_ids) for s in samples)
    kl_sum, pg = 0.0, 0.0
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        pos = slice(len(s.prompt_ids) - 1, len(s.prompt_ids) - 1 + len(s.response_ids))
        tgt = torch.tensor(s.response_ids)
        lp = torch.log_softmax(pol(input_ids=ids).logits[0, pos].float() / T, -1).gather(-1, tgt[:, None])[:, 0]
        with torch.no_grad():
            if lora:
                with pol.disable_adapter():
                    rl = torch.log_softmax(pol(input_ids=ids).logits[0, pos].float() / T, -1)
            else:
                rl = torch.log_softmax(ref_model(input_ids=ids).logits[0, pos].float() / T, -1)
            rl = rl.gather(-1, tgt[:, None])[:, 0]
        d = lp - rl
        kl = {"k1": d, "k2": 0.5 * d**2, "k3": torch.exp(-d) + d - 1}[estimator]
        kl_sum = kl_sum + kl.sum()
        pg = pg + (-s.advantage * torch.exp(lp - lp.detach())).sum()
    (pg / n_tok + 0.1 * kl_sum / n_tok).backward()
    assert m["loss/kl"] == pytest.approx(float(kl_sum) / n_tok, rel=1e-4, abs=1e-7)
    assert abs(m["loss/kl"]) > 1e-4
    for n, p in pol.named_parameters():
        if p.grad is not None:
            assert_close(grads[0][n], p.grad, atol=1e-6, rtol=1e-3, msg=n)


def test_the_logged_grad_norm_is_before_clipping_and_the_step_uses_the_clipped_gradient(tiny_model_dir):
    ov = ["train.micro_batch_size=3"]
    g_free, m_free, _, _ = _run(tiny_model_dir, ov)
    norm = sum(float(g.pow(2).sum()) for g in g_free[0].values()) ** 0.5
    assert m_free["train/grad_norm"] == pytest.approx(norm, rel=1e-5)
    g_clip, m_clip, _, _ = _run(tiny_model_dir, [*ov, "train.max_grad_norm=0.01"])
    assert norm > 0.02
    assert m_clip["train/grad_norm"] == pytest.approx(norm, rel=1e-5)  # pre-clip, as TRL logs
    clipped = sum(float(g.pow(2).sum()) for g in g_clip[0].values()) ** 0.5
    assert clipped == pytest.approx(0.01, rel=1e-4)
    for k in g_free[0]:
        assert_close(g_clip[0][k], g_free[0][k] * (0.01 / norm), atol=1e-8, rtol=1e-3)


@pytest.mark.parametrize("lora", [False, True])
def test_every_layout_gives_the_plain_forwards_gradient(tiny_model_dir, lora):
    """Shared prompts, gradient checkpointing and chunked log-probs change how the gradient is computed, with or
    without LoRA, never its value: each gives the gradient written out with one plain forward per sample."""
    ref = None
    for share, ckpt, chunk in itertools.product([False, True], [False, True], [2, 1024]):
        ov = [f"train.share_prompt_forward={str(share).lower()}", f"train.gradient_checkpointing={str(ckpt).lower()}",
              f"train.logprob_chunk={chunk}", "train.micro_batch_size=4", "train.skip_zero_advantage=false"]
        grads, _, samples, _ = _run(tiny_model_dir, ov, lora=lora)
        ref = ref or _pg_reference_grads(tiny_model_dir, samples, "dapo", lora)
        assert set(grads[0]) == set(ref), (share, ckpt, chunk)
        for k in ref:
            assert ref[k].abs().sum() > 0, k
            assert_close(grads[0][k], ref[k], atol=1e-6, rtol=1e-4, msg=f"share={share} ckpt={ckpt} chunk={chunk} {k}")


def _transformers4_checkpointing(model):
    """Give `model` transformers 4.x's checkpointing switch (pyproject allows >= 4.56.2): no
    `activation_checkpointing_enable`, and `gradient_checkpointing_enable` checkpoints with use_reentrant=True
    unless told otherwise, without making the embeddings' output require a gradient (peft models included)."""
    import functools

    from torch.utils.checkpoint import checkpoint

    base = model.get_base_model() if hasattr(model, "get_base_model") else model

    def enable(gradient_checkpointing_kwargs=None):
        kwargs = gradient_checkpointing_kwargs or {"use_reentrant": True}  # transformers 4.x's default
        base._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=functools.partial(checkpoint, **kwargs))

    base.activation_checkpointing_enable = None  # the 5.x name does not exist in 4.x
    base.gradient_checkpointing_enable = enable


def test_lora_with_gradient_checkpointing_trains_the_adapters_under_transformers_4(tiny_model_dir):
    """train.gradient_checkpointing called the model's switch with no arguments: transformers 4.x (which pyproject
    allows) then checkpoints with use_reentrant=True, and under LoRA the frozen embeddings' output needs no
    gradient, so a reentrant checkpoint cuts the graph: the adapters inside the checkpointed layers got no
    gradient (the update's backward failed outright where nothing else was trainable)."""
    ov = ["train.micro_batch_size=4", "train.skip_zero_advantage=false", "model.lora.enabled=true"]
    cfg = load_config(None, ["model.dtype=float32", f"rollout.temperature={T}", "train.max_grad_norm=1e9",
                             "train.warmup_steps=0", "train.gradient_checkpointing=true", *ov])
    model = _model(tiny_model_dir, lora=True)
    _transformers4_checkpointing(model)
    tr = PolicyTrainer(cfg, model, pad_id=0)
    assert tr.model.get_base_model().model.layers[0].gradient_checkpointing
    grads = []
    tr.optimizer.step = lambda: grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                                              if p.grad is not None})
    samples = _samples()
    tr.compute_advantages(samples)
    tr.update(samples)
    ref = _pg_reference_grads(tiny_model_dir, samples, "dapo", lora=True)
    assert set(grads[0]) == set(ref)
    for k in ref:
        assert_close(grads[0][k], ref[k], atol=1e-6, rtol=1e-4, msg=k)


def test_the_lora_reference_runs_without_dropout_like_the_full_reference(tiny_model_dir):
    """The full-weights reference is an eval-mode copy: no dropout. The LoRA reference (the policy with its
    adapters off) ran in the update's training mode: with train.disable_dropout=false its log-probs carried fresh
    dropout noise at every forward, so the KL term compared the policy with a random reference."""
    batch_samples = _samples()[:4]
    from rollwise.training.logprobs import pack, response_logprobs

    batch = pack([s.prompt_ids for s in batch_samples], [s.response_ids for s in batch_samples], 0)
    torch.manual_seed(0)
    model = load_model(str(tiny_model_dir))
    model.config._attn_implementation = "eager"  # eager attention applies attention_dropout while training
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    cfg = load_config(None, ["model.dtype=float32", "algo.beta=0.1", "train.disable_dropout=false",
                             "model.lora.enabled=true", "model.lora.target_modules=[q_proj, v_proj]"])
    lora = apply_lora(model, cfg.model)
    tr = PolicyTrainer(cfg, lora, pad_id=0)
    assert tr.ref_model is None
    tr.model.train()
    first, second = tr._ref_logprobs(batch), tr._ref_logprobs(batch)
    assert tr.model.training  # the update's mode is left as it was
    with torch.no_grad(), lora.disable_adapter():
        lora.eval()
        want, _ = response_logprobs(lora, batch, cfg.rollout.temperature)
    assert_close(first, want, atol=1e-6, rtol=1e-6)
    assert_close(second, want, atol=1e-6, rtol=1e-6)
