import copy
import math

import pytest
import torch
from torch.testing import assert_close

from rollwise.algos import OFFPOLICY_CORRECTIONS, aggregate_loss, ppo_clip_loss
from rollwise.config import load_config
from rollwise.models import apply_lora, load_model
from rollwise.training.logprobs import pack, response_logprobs
from rollwise.training.policy import PolicyTrainer, lr_lambda
from rollwise.types import Sample


def _samples(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    # group a: mixed rewards; group b: all equal (advantage exactly 0); group c: singleton
    for uid, rewards in (("a", [1.0, 0.0, 0.0, 1.0]), ("b", [1.0, 1.0, 1.0]), ("c", [0.0])):
        for r in rewards:
            plen = int(torch.randint(2, 6, (1,), generator=g))
            rlen = int(torch.randint(1, 7, (1,), generator=g))
            p = torch.randint(4, 90, (plen,), generator=g).tolist()
            resp = torch.randint(4, 90, (rlen,), generator=g).tolist()
            out.append(Sample(uid, 0, p, resp, [0.0] * rlen, [0] * rlen, "stop", reward=r))
    return out


def _grads(model_dir, overrides, samples=None):
    cfg = load_config(None, ["model.dtype=float32", "train.micro_batch_size=2", *overrides])
    torch.manual_seed(0)
    model = load_model(str(model_dir))
    tr = PolicyTrainer(cfg, model, pad_id=0)
    captured = []
    tr.optimizer.step = lambda: captured.append({n: p.grad.clone() for n, p in model.named_parameters()})
    samples = _samples() if samples is None else samples
    tr.compute_advantages(samples)
    m = tr.update(samples)
    return captured[0], m, samples


def test_zero_advantage_samples_are_skipped_with_identical_gradient(tiny_model_dir):
    for loss_type in ("dapo", "grpo", "dr_grpo"):
        for policy_loss in ("ppo_clip", "gspo", "cispo"):
            ov = [f"algo.loss_type={loss_type}", f"algo.policy_loss={policy_loss}"]
            g_skip, m_skip, samples = _grads(tiny_model_dir, ov + ["train.skip_zero_advantage=true"])
            g_all, m_all, _ = _grads(tiny_model_dir, ov + ["train.skip_zero_advantage=false"])
            assert m_skip["train/skipped_zero_adv"] == 4  # 3 in the all-equal group + the singleton
            assert m_all["train/skipped_zero_adv"] == 0
            assert [s.advantage for s in samples if s.prompt_uid != "a"] == [0.0] * 4
            for n in g_all:
                torch.testing.assert_close(g_skip[n], g_all[n], atol=1e-6, rtol=1e-4, msg=f"{loss_type}/{policy_loss} {n}")
            torch.testing.assert_close(torch.tensor(m_skip["loss/policy"]), torch.tensor(m_all["loss/policy"]))
            assert any(g.abs().sum() > 0 for g in g_skip.values())


def test_beta_forces_every_sample_through(tiny_model_dir):
    _, m, _ = _grads(tiny_model_dir, ["algo.beta=0.1"])
    assert m["train/skipped_zero_adv"] == 0


def test_the_kl_reference_is_the_starting_policy_in_bf16_too(tiny_model_dir):
    """The policy keeps float32 weights and runs under bf16 autocast; a reference copied to bf16
    weights differed from it before any update (SmolLM2-135M: loss/kl 7.5e-4 at step 0). It keeps the
    policy's weights and runs under the same autocast, so at step 0 the KL is exactly 0."""
    torch.manual_seed(0)
    model = load_model(str(tiny_model_dir))
    tr = PolicyTrainer(load_config(None, ["model.dtype=bfloat16", "algo.beta=0.1"]), model, pad_id=0)
    assert {p.dtype for p in tr.ref_model.parameters()} == {p.dtype for p in model.parameters()}
    rows = _samples()
    batch = pack([s.prompt_ids for s in rows], [s.response_ids for s in rows], 0)
    with torch.no_grad(), tr._autocast():
        logp, _ = response_logprobs(model, batch, 1.0, 1024)
    assert torch.equal(tr._ref_logprobs(batch), logp)


def test_kl_term_adds_beta_times_the_k3_gradient_against_the_reference(tiny_model_dir):
    """With a reference that differs from the policy, the update's gradient is the policy-gradient
    one plus beta x the gradient of the token-mean k3 estimate exp(r) - r - 1, r = ref - logp,
    written out here by hand; loss/kl is that token mean."""
    ov = ["model.dtype=float32", "train.micro_batch_size=16", "train.skip_zero_advantage=false", NO_CLIP]
    torch.manual_seed(0)
    model = load_model(str(tiny_model_dir))
    tr = PolicyTrainer(load_config(None, [*ov, "algo.beta=0.1"]), model, pad_id=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a reference the policy has moved away from
        for p in tr.ref_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    captured = []
    tr.optimizer.step = lambda: captured.append({n: p.grad.clone() for n, p in model.named_parameters()})
    samples = _samples()
    tr.compute_advantages(samples)
    m = tr.update(samples)
    g_pg, _, _ = _grads(tiny_model_dir, ov[1:])  # the same update without the KL term
    # by hand, on fresh weights (the captured gradient is taken before the optimizer step)
    torch.manual_seed(0)
    fresh = load_model(str(tiny_model_dir))
    fresh.train()
    rows = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.response_ids))
    batch = pack([s.prompt_ids for s in rows], [s.response_ids for s in rows], 0)
    mask = batch.response_mask.float()  # [B, R]
    logp, _ = response_logprobs(fresh, batch, 1.0, 1024)  # [B, R]
    with torch.no_grad():
        ref, _ = response_logprobs(tr.ref_model, batch, 1.0, 1024)
    r = ref - logp
    k3 = torch.exp(r) - r - 1
    kl_mean = (k3 * mask).sum() / mask.sum()
    (0.1 * kl_mean).backward()
    assert m["loss/kl"] == pytest.approx(float(kl_mean.detach()), rel=1e-4) and m["loss/kl"] > 1e-4
    moved = 0
    for n, p in fresh.named_parameters():
        assert_close(captured[0][n] - g_pg[n], p.grad, atol=1e-6, rtol=1e-3, msg=n)
        moved += float(p.grad.abs().sum()) > 0
    assert moved > 0


def test_mask_truncated_completions_excludes_them(tiny_model_dir):
    cfg = load_config(None, ["model.dtype=float32", "algo.mask_truncated_completions=true"])
    model = load_model(str(tiny_model_dir))
    tr = PolicyTrainer(cfg, model, pad_id=0)
    samples = _samples()
    for s in samples:
        s.finish_reason = "length"
    tr.compute_advantages(samples)
    m = tr.update(samples)
    assert m["train/forwarded_sequences"] == 0
    assert (m["train/masked_sequences"], m["train/skipped_zero_adv"]) == (len(samples), 0)  # cut, not zero-advantage
    # two of group a's four samples cut: only the other two are trained, and the token mean counts only
    # the tokens of samples not cut (the reference written out with those tokens masked)
    samples = _samples()
    for s in samples[:2]:
        s.finish_reason = "length"
    g, m, samples = _grads(tiny_model_dir, ["algo.mask_truncated_completions=true", "train.micro_batch_size=16",
                                            NO_CLIP], samples)
    assert m["train/forwarded_sequences"] == 2
    g_ref, _ = _reference(tiny_model_dir, samples, lambda s: [float(s.finish_reason != "length")] * len(s.response_ids))
    for n in g_ref:
        assert_close(g[n], g_ref[n], atol=1e-6, rtol=1e-4, msg=n)
    assert any(x.abs().sum() > 0 for x in g.values())


def test_lr_schedule():
    f = lr_lambda(2, 10, "linear")
    assert [round(f(i), 3) for i in (0, 1, 2, 6, 10)] == [0.5, 1.0, 1.0, 0.5, 0.0]
    c = lr_lambda(0, 10, "cosine")
    assert abs(c(5) - 0.5) < 1e-9 and abs(c(0) - 1.0) < 1e-9
    assert lr_lambda(0, 10, "constant")(7) == 1.0


def test_lr_schedule_decays_over_the_token_budget_when_it_ends_the_run_first():
    spent = [0.0]
    f = lr_lambda(2, 102, "linear", lambda: spent[0])
    assert f(0) == 0.5  # warm-up is counted in updates whatever the budget
    spent[0] = 0.5
    assert f(12) == 0.5  # 10 of 100 decay updates done, half the tokens spent: the tokens lead
    spent[0] = 0.2
    assert f(52) == 0.5  # 50 of 100 updates done, a fifth of the tokens: the updates lead
    spent[0] = 1.3
    assert f(3) == 0.0  # the budget overshot on the last batch: never negative
    spent[0] = 0.5
    assert abs(lr_lambda(0, 100, "cosine", lambda: spent[0])(0) - 0.5) < 1e-12
    assert lr_lambda(0, 100, "constant", lambda: spent[0])(0) == 1.0


def test_trainer_lr_follows_the_budget_it_is_given(tiny_model_dir):
    ov = ["model.dtype=float32", "train.learning_rate=1e-3", "train.warmup_steps=0", "train.lr_scheduler=linear",
          "train.max_steps=100"]
    model = load_model(str(tiny_model_dir))
    cfg = load_config(None, [*ov, "train.max_rollout_tokens=1000", "algo.num_iterations=2"])
    tr = PolicyTrainer(cfg, model, pad_id=0)
    used = []
    step = tr.optimizer.step
    tr.optimizer.step = lambda: (used.append(tr.optimizer.param_groups[0]["lr"]), step())
    samples = _samples()
    tr.compute_advantages(samples)
    m = tr.update(samples, budget=(0.5, 0.7))  # the two updates at 0.5 and 0.6 of the budget
    assert used == pytest.approx([5e-4, 4e-4]) and m["train/lr"] == pytest.approx(4e-4)
    # without a token budget the schedule counts updates only: update 0 of 100 runs at the full rate
    tr = PolicyTrainer(load_config(None, ov), load_model(str(tiny_model_dir)), pad_id=0)
    tr.compute_advantages(samples)
    assert tr.update(samples, budget=(0.5, 0.7))["train/lr"] == pytest.approx(1e-3)


def test_the_token_budget_decay_starts_where_warm_up_ends(tiny_model_dir):
    """The decay runs over the budget left after warm-up: the tokens spent in warm-up are not decay
    already done (with 20% spent in warm-up the rate fell from 1.0 to 0.8 in one update)."""
    ov = ["model.dtype=float32", "train.learning_rate=1e-3", "train.warmup_steps=2", "train.lr_scheduler=linear",
          "train.max_steps=100", "train.max_rollout_tokens=1000"]
    tr = PolicyTrainer(load_config(None, ov), load_model(str(tiny_model_dir)), pad_id=0)
    rates = []
    for spent in (0.0, 0.1, 0.2, 0.6):  # two warm-up updates, then the first two of the decay
        rates.append(tr._apply_lr(spent))
        tr.optimizer.step()  # no gradients: the weights stay; the order the scheduler expects
        tr.scheduler.step()
    assert rates == pytest.approx([5e-4, 1e-3, 1e-3, 5e-4])  # (0.6 - 0.2) / (1 - 0.2) of the decay done
    again = PolicyTrainer(load_config(None, ov), load_model(str(tiny_model_dir)), pad_id=0)
    again.load_state_dict(tr.state_dict())  # a resumed run keeps where its decay began
    assert again._apply_lr(0.8) == pytest.approx(tr._apply_lr(0.8)) == pytest.approx(2.5e-4)


def test_a_resume_that_changes_the_learning_rate_trains_at_the_new_rate(tiny_model_dir):
    """The scheduler's saved base rate overrode train.learning_rate on resume: the resume said it changed
    the rate, then trained at the old one."""
    ov = ["model.dtype=float32", "train.warmup_steps=0", "train.lr_scheduler=constant", "train.max_steps=100"]
    tr = PolicyTrainer(load_config(None, [*ov, "train.learning_rate=1e-3"]), load_model(str(tiny_model_dir)), pad_id=0)
    tr.optimizer.step()
    tr.scheduler.step()
    again = PolicyTrainer(load_config(None, [*ov, "train.learning_rate=1e-4", "train.adam_beta2=0.95",
                                             "train.weight_decay=0.1"]), load_model(str(tiny_model_dir)), pad_id=0)
    again.load_state_dict(tr.state_dict())
    assert again._apply_lr(0.0) == pytest.approx(1e-4)
    group = again.optimizer.param_groups[0]  # the optimizer's saved settings overrode these too
    assert group["betas"][1] == 0.95 and group["weight_decay"] == 0.1
    assert again.scheduler.last_epoch == 1  # the schedule's position is the checkpoint's


def test_an_update_whose_gradient_is_not_finite_is_refused_and_applies_nothing(tiny_model_dir):
    """A diverged policy (a learning rate far too high) trained on to NaN weights, saved them and ended with
    exit code 0."""
    from rollwise.errors import TrainingDivergedError

    model = load_model(str(tiny_model_dir))
    tr = PolicyTrainer(load_config(None, ["model.dtype=float32", "train.warmup_steps=0"]), model, pad_id=0)
    samples = _samples()
    tr.compute_advantages(samples)
    p = next(q for q in model.parameters() if q.requires_grad)
    with torch.no_grad():
        p[0, 0] = float("nan")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TrainingDivergedError, match="not finite.*train.learning_rate"):
        tr.update(samples)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if torch.isfinite(before[k]).all())
    # a step that overflows (a rate far too high) from a finite gradient: stopped before any save
    model = load_model(str(tiny_model_dir))
    tr = PolicyTrainer(load_config(None, ["model.dtype=float32", "train.warmup_steps=0"]), model, pad_id=0)
    tr.compute_advantages(samples)
    step = tr.optimizer.step

    def overflowing_step():
        step()
        with torch.no_grad():
            next(q for q in model.parameters() if q.requires_grad)[0, 0] = float("inf")

    tr.optimizer.step = overflowing_step
    with pytest.raises(TrainingDivergedError, match="left weights that are not finite"):
        tr.update(samples)


# ---------------------------------------------------------------- off-policy corrections

NO_CLIP = "train.max_grad_norm=1e9"  # the captured gradients are taken after clipping: keep it out of the way


def _reference(model_dir, samples, keep_fn, loss_type="dapo", num_tokens=None):
    """The plain on-policy PPO loss and gradient written out with the library pieces, on one batch
    of every trained row (sorted like the trainer sorts them); keep_fn(sample) -> 0/1 per token."""
    torch.manual_seed(0)
    model = load_model(str(model_dir))
    model.train()
    rows = sorted((s for s in samples if not s.stop_gradient), key=lambda s: len(s.prompt_ids) + len(s.response_ids))
    batch = pack([s.prompt_ids for s in rows], [s.response_ids for s in rows], 0)
    keep = torch.zeros_like(batch.response_mask)  # [B, R]
    for b, s in enumerate(rows):
        keep[b, : len(s.response_ids)] = torch.tensor(keep_fn(s), dtype=torch.float32)
    logp, _ = response_logprobs(model, batch, 1.0, 1024)  # [B, R]
    adv = torch.tensor([s.advantage for s in rows])
    per_tok, _ = ppo_clip_loss(logp, logp.detach(), adv, keep, epsilon=0.2, epsilon_high=0.2)
    num_tokens = keep.sum() if num_tokens is None else num_tokens
    loss = aggregate_loss(per_tok, keep, loss_type, max_completion_length=48, num_tokens=num_tokens,
                          num_sequences=len(rows))
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, float(loss.detach())


@torch.no_grad()
def _recomputed_logprobs(model_dir, samples):
    """What the trainer's own weights give for each response token, one sample at a time."""
    model = load_model(str(model_dir))
    out = []
    for s in samples:
        lp, _ = response_logprobs(model, pack([s.prompt_ids], [s.response_ids], 0))
        out.append(lp[0, : len(s.response_ids)].tolist())
    return out


def test_recompute_is_the_plain_on_policy_loss_bit_for_bit(tiny_model_dir):
    samples = _samples()
    for s in samples:  # behaviour log-probs far from the model's: recompute must not read them
        s.behaviour_logprobs = [-0.5] * len(s.response_ids)
    g, m, samples = _grads(tiny_model_dir, ["train.micro_batch_size=16", "train.skip_zero_advantage=false", NO_CLIP],
                           samples)
    g_ref, loss_ref = _reference(tiny_model_dir, samples, lambda s: [1.0] * len(s.response_ids))
    assert m["loss/policy"] == loss_ref
    for n in g_ref:
        assert torch.equal(g[n], g_ref[n]), n
    assert m["offpolicy/kept_frac"] == 1.0 and m["offpolicy/weight_mean"] == 1.0
    assert m["offpolicy/behaviour_kl"] > 3.0  # logged: mean of -0.5 - logp, and logp is about -4.6 here


def test_tis_weights_the_policy_gradient_by_the_capped_ratio(tiny_model_dir):
    exact = _recomputed_logprobs(tiny_model_dir, _samples())
    g_rec, m_rec, _ = _grads(tiny_model_dir, [NO_CLIP, "algo.offpolicy_correction=recompute"])

    def run(shift, extra=()):
        samples = _samples()
        for s, lp in zip(samples, exact):
            s.behaviour_logprobs = [x - shift for x in lp]
        return _grads(tiny_model_dir, [NO_CLIP, "algo.offpolicy_correction=tis", *extra], samples)

    # behaviour = the recomputed log-probs: weights 1, the loss and gradient of recompute
    g, m, _ = run(0.0)
    assert_close(torch.tensor(m["loss/policy"]), torch.tensor(m_rec["loss/policy"]), rtol=1e-5, atol=1e-7)
    for n in g_rec:
        assert_close(g[n], g_rec[n], rtol=1e-4, atol=1e-7, msg=n)
    assert abs(m["offpolicy/weight_mean"] - 1.0) < 1e-5 and abs(m["offpolicy/behaviour_kl"]) < 1e-5
    # behaviour 1.5x less likely than the proximal policy on every token: weights 1.5 (< C = 2), so at
    # iteration 0 (ratio 1) the gradient is exactly 1.5x recompute's; a correction left unused gives 1x
    g, m, _ = run(math.log(1.5))
    assert_close(torch.tensor(m["loss/policy"]), 1.5 * torch.tensor(m_rec["loss/policy"]), rtol=1e-4, atol=1e-7)
    for n in g_rec:
        assert_close(g[n], 1.5 * g_rec[n], rtol=1e-4, atol=1e-7, msg=n)
    assert abs(m["offpolicy/weight_mean"] - 1.5) < 1e-4 and m["offpolicy/clip_frac"] == 0.0
    # 3x less likely: every weight is capped, at C = 2 by default, at 2.5 when tis_cap says so
    for cap_args, cap in (((), 2.0), (("algo.tis_cap=2.5",), 2.5)):
        g, m, _ = run(math.log(3.0), cap_args)
        for n in g_rec:
            assert_close(g[n], cap * g_rec[n], rtol=1e-4, atol=1e-7, msg=n)
        assert m["offpolicy/clip_frac"] == 1.0 and abs(m["offpolicy/weight_mean"] - cap) < 1e-6


def _resumed_samples():
    """The fixture batch as partial rollouts: the first half of each response (rounded down) came
    from policy version 3, the rest from version 4; plus a replayed stop-gradient response."""
    samples = _samples()
    for s in samples:
        n = len(s.response_ids)
        s.versions = [3] * (n // 2) + [4] * (n - n // 2)
    s0 = samples[0]
    samples.append(Sample(s0.prompt_uid, 0, s0.prompt_ids, [5, 6, 7], [-1.0] * 3, [-1] * 3, "stop", reward=1.0,
                          stop_gradient=True))
    return samples


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_mask_resumed_trains_only_on_the_newest_versions_tokens(tiny_model_dir, loss_type):
    ov = [NO_CLIP, f"algo.loss_type={loss_type}"]
    g, m, samples = _grads(tiny_model_dir, [*ov, "algo.offpolicy_correction=mask_resumed"], _resumed_samples())
    newest = lambda s: [1.0 if v == max(s.versions) else 0.0 for v in s.versions]  # noqa: E731
    g_ref, loss_ref = _reference(tiny_model_dir, samples, newest, loss_type)
    assert any(v.abs().sum() > 0 for v in g_ref.values())
    assert_close(torch.tensor(m["loss/policy"]), torch.tensor(loss_ref), rtol=1e-5, atol=1e-7)
    for n in g_ref:
        assert_close(g[n], g_ref[n], rtol=1e-4, atol=1e-7, msg=n)
    # the same batch without the correction trains on the prefixes too, and differs
    g_rec, _, _ = _grads(tiny_model_dir, ov, _resumed_samples())
    assert any(not torch.allclose(g_rec[n], g_ref[n], rtol=1e-3, atol=1e-6) for n in g_ref)
    # metrics cover the forwarded rows, like the loss metrics (zero-advantage rows are skipped)
    trained = [s for s in samples if not s.stop_gradient and s.advantage != 0]
    resumed = sum(len(s.response_ids) // 2 for s in trained) / sum(len(s.response_ids) for s in trained)
    assert 0 < resumed < 1
    assert abs(m["offpolicy/resumed_frac"] - resumed) < 1e-6 and abs(m["offpolicy/kept_frac"] - (1 - resumed)) < 1e-6


def test_icepop_masks_by_ratio_and_keeps_the_unmasked_normaliser(tiny_model_dir):
    exact = _recomputed_logprobs(tiny_model_dir, _samples())

    def samples():  # odd tokens: behaviour e times less likely than the proximal policy, outside [0.5, 2]
        out = _samples()
        for s, lp in zip(out, exact):
            s.behaviour_logprobs = [x - (t % 2) for t, x in enumerate(lp)]
        return out

    ov = [NO_CLIP, "algo.offpolicy_correction=icepop"]
    g, m, trained = _grads(tiny_model_dir, ov, samples())
    even = lambda s: [float(t % 2 == 0) for t in range(len(s.response_ids))]  # noqa: E731
    all_tokens = sum(len(s.response_ids) for s in trained)
    g_ref, loss_ref = _reference(tiny_model_dir, trained, even, num_tokens=all_tokens)  # documented choice
    assert_close(torch.tensor(m["loss/policy"]), torch.tensor(loss_ref), rtol=1e-5, atol=1e-7)
    for n in g_ref:
        assert_close(g[n], g_ref[n], rtol=1e-4, atol=1e-7, msg=n)
    assert 0 < m["offpolicy/masked_frac"] < 1
    g_all, _, _ = _grads(tiny_model_dir, [*ov, "train.skip_zero_advantage=false"], samples())
    for n in g_ref:
        assert_close(g_all[n], g[n], rtol=1e-4, atol=1e-7, msg=n)


def test_every_correction_runs_and_logs_its_metrics(tiny_model_dir):
    # the fixture's behaviour log-probs are 0 (probability 1): ratios pi_prox / pi_behav are the model's
    # probabilities, ~1/99, far outside IcePop's band and M2PO's trust region
    kept = {}
    for name in OFFPOLICY_CORRECTIONS:
        g, m, _ = _grads(tiny_model_dir, [f"algo.offpolicy_correction={name}", "algo.num_iterations=2"],
                         _resumed_samples())
        assert math.isfinite(m["loss/policy"]) and all(torch.isfinite(v).all() for v in g.values()), name
        assert {"offpolicy/kept_frac", "offpolicy/weight_mean", "offpolicy/behaviour_kl"} <= m.keys(), name
        kept[name] = m["offpolicy/kept_frac"]
    assert kept["recompute"] == kept["tis"] == kept["decoupled"] == 1.0
    assert 0 < kept["mask_resumed"] < 1
    assert kept["m2po"] < 0.2  # at least one token is always kept
    # IcePop's default band [0.5, 2] drops every token here: nothing is trained
    assert kept["icepop"] == 0.0
    g, m, _ = _grads(tiny_model_dir, ["algo.offpolicy_correction=icepop"])
    assert m["offpolicy/masked_frac"] == 1.0 and m["loss/policy"] == 0.0 and all(v.abs().sum() == 0 for v in g.values())
    # a band widened to [1e-6, 2] keeps them all, weighted by their (small) ratios
    g, m, _ = _grads(tiny_model_dir, ["algo.offpolicy_correction=icepop", "algo.icepop_low=1e-6"])
    assert m["offpolicy/kept_frac"] == 1.0 and m["offpolicy/weight_mean"] < 0.1
    assert any(v.abs().sum() > 0 for v in g.values())


def test_behaviour_logprobs_must_match_the_response(tiny_model_dir):
    samples = _samples()
    samples[2].behaviour_logprobs = samples[2].behaviour_logprobs[:-1]
    with pytest.raises(ValueError, match="behaviour log-probs"):
        _grads(tiny_model_dir, [], copy.deepcopy(samples))


# ---------------------------------------------------------------- shared prompt forward

def _grouped_samples(seed=0):
    """Groups of samples that share a prompt (lengths differ across groups: left padding), one
    with an empty response, and a singleton group."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for uid, plen, rewards in (("a", 5, [1.0, 0.0, 0.0, 1.0]), ("b", 9, [1.0, 0.0, 1.0]), ("c", 3, [0.0, 1.0]),
                               ("d", 4, [1.0])):
        p = torch.randint(4, 90, (plen,), generator=g).tolist()
        for j, r in enumerate(rewards):
            rlen = 0 if (uid, j) == ("b", 1) else int(torch.randint(1, 8, (1,), generator=g))
            resp = torch.randint(4, 90, (rlen,), generator=g).tolist()
            out.append(Sample(uid, 0, p, resp, [0.0] * rlen, [0] * rlen, "stop", reward=r))
    return out


def test_shared_prompt_batch_gives_the_packed_logprobs_and_gradients(tiny_model_dir):
    from rollwise.training.logprobs import pack_shared

    samples = _grouped_samples()
    prompts, responses = [s.prompt_ids for s in samples], [s.response_ids for s in samples]
    shared = pack_shared(prompts, responses, 0)
    assert shared.prompt_ids.shape[0] == 4 and shared.row_prompt.tolist() == [0] * 4 + [1] * 3 + [2] * 2 + [3]
    results = []
    for batch in (pack(prompts, responses, 0), shared):
        torch.manual_seed(0)
        model = load_model(str(tiny_model_dir))
        model.train()
        logp, ent = response_logprobs(model, batch, 0.7, 5, want_entropy=True)  # chunks cross rows
        (logp.sum() + ent.sum()).backward()
        results.append((logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp_a, en_a, g_a), (lp_b, en_b, g_b) = results
    assert lp_a.shape == lp_b.shape == (10, max(len(r) for r in responses))
    assert_close(lp_b, lp_a, atol=1e-5, rtol=1e-5)
    assert_close(en_b, en_a, atol=1e-5, rtol=1e-5)
    assert (lp_b[5] == 0).all() and samples[5].response_ids == []  # the empty response: nothing, not garbage
    for n in g_a:
        assert_close(g_b[n], g_a[n], atol=1e-5, rtol=1e-4, msg=n)


def test_trainer_shares_prompts_with_the_same_update(tiny_model_dir, monkeypatch):
    import rollwise.training.policy as policy

    calls = []
    real = policy.pack_shared
    monkeypatch.setattr(policy, "pack_shared", lambda *a: calls.append(len(a[0])) or real(*a))
    ov = ["train.micro_batch_size=4", NO_CLIP, "algo.beta=0.05"]  # beta: the reference forward shares too
    g_on, m_on, _ = _grads(tiny_model_dir, ov, _grouped_samples())
    # 9 rows (the empty response has nothing to train), ordered d, c c, a a a a, b b: micro-batches
    # [d c c a] and [a a a b] repeat a prompt, the last [b] is one row and takes the plain layout
    assert calls == [4, 4]
    g_off, m_off, _ = _grads(tiny_model_dir, [*ov, "train.share_prompt_forward=false"], _grouped_samples())
    assert len(calls) == 2
    assert_close(torch.tensor(m_on["loss/policy"]), torch.tensor(m_off["loss/policy"]), atol=1e-6, rtol=1e-5)
    assert_close(torch.tensor(m_on["loss/kl"]), torch.tensor(m_off["loss/kl"]), atol=1e-6, rtol=1e-5)
    for n in g_off:
        assert_close(g_on[n], g_off[n], atol=1e-6, rtol=1e-4, msg=n)
    assert any(g.abs().sum() > 0 for g in g_on.values())


def test_prompt_sharing_is_off_where_the_cache_cannot_be_shared(tiny_model_dir):
    from transformers import MistralConfig, MistralForCausalLM

    from rollwise.training.logprobs import shares_prompts

    model = load_model(str(tiny_model_dir))
    assert shares_prompts(model)
    model.gradient_checkpointing_enable()  # turns the cache off in training
    assert not shares_prompts(model)
    cfg = load_config(None, ["model.dtype=float32", "model.lora.enabled=true", "model.lora.r=4"])
    lora = apply_lora(load_model(str(tiny_model_dir)), cfg.model)
    assert shares_prompts(lora)
    lora.gradient_checkpointing_enable()  # the flag lives on the wrapped model
    assert not shares_prompts(lora)
    small = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2}
    assert not shares_prompts(MistralForCausalLM(MistralConfig(**small, sliding_window=4)))
    cfg = load_config(None, ["model.dtype=float32"])
    assert not PolicyTrainer(cfg, MistralForCausalLM(MistralConfig(**small, sliding_window=4)), pad_id=0).share_prompts


def test_each_correction_gets_its_own_options_from_the_config():
    """algo.* options reach their correction under the names the correction function takes (a dropped
    or swapped key in the mapping would leave the option accepted and ignored)."""
    import inspect

    from rollwise.training.policy import _correction_options

    cases = {
        "tis": (["algo.tis_cap=2.5"], {"cap": 2.5}),
        "decoupled": (["algo.decoupled_cap=3.5"], {"cap": 3.5}),
        "m2po": (["algo.m2po_tau=0.07"], {"tau": 0.07}),
        "icepop": (["algo.icepop_low=0.3", "algo.icepop_high=4.0", "algo.icepop_weighted=false"],
                   {"low": 0.3, "high": 4.0, "weighted": False}),
    }
    for name, (ov, want) in cases.items():
        cfg = load_config(None, [f"algo.offpolicy_correction={name}", *ov])
        assert _correction_options(cfg.algo) == want, name
        params = inspect.signature(OFFPOLICY_CORRECTIONS[name]).parameters
        assert set(want) <= set(params), (name, set(params))
    assert _correction_options(load_config(None, ["algo.offpolicy_correction=recompute"]).algo) == {}


def test_optimizer_and_lora_options_reach_torch_and_peft(tiny_model_dir):
    cfg = load_config(None, ["model.dtype=float32", "train.weight_decay=0.1", "train.adam_beta1=0.8",
                             "train.adam_beta2=0.95", "train.learning_rate=3e-5"])
    group = PolicyTrainer(cfg, load_model(str(tiny_model_dir)), pad_id=0).optimizer.param_groups[0]
    assert (group["weight_decay"], group["betas"], group["initial_lr"]) == (0.1, (0.8, 0.95), 3e-5)
    cfg = load_config(None, ["model.dtype=float32", "model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8",
                             "model.lora.dropout=0.2", "model.lora.target_modules=[q_proj]"])
    lora = apply_lora(load_model(str(tiny_model_dir)), cfg.model)
    pc = lora.peft_config["default"]
    assert (pc.r, pc.lora_alpha, pc.lora_dropout, set(pc.target_modules)) == (4, 8, 0.2, {"q_proj"})
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in lora.named_parameters() if ".lora_A" in n}
    assert adapted == {"q_proj"}


def test_entropy_bonus_subtracts_coef_times_the_token_mean_entropy_gradient(tiny_model_dir):
    """algo.entropy_coef: the gradient is the policy-gradient one minus coef x the gradient of the
    token-mean entropy of the next-token distribution, written out here one sample at a time."""
    ov = ["train.micro_batch_size=16", "train.skip_zero_advantage=false", NO_CLIP]
    g_ent, m, samples = _grads(tiny_model_dir, [*ov, "algo.entropy_coef=0.1"])
    g_pg, _, _ = _grads(tiny_model_dir, ov)
    torch.manual_seed(0)
    model = load_model(str(tiny_model_dir))
    model.train()
    ents = []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logits = model(ids).logits[0, len(s.prompt_ids) - 1 : -1].float()  # the positions that predict the response
        ents.append(-(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1))
    mean_ent = torch.cat(ents).mean()
    (-0.1 * mean_ent).backward()
    assert m["loss/entropy"] == pytest.approx(float(mean_ent.detach()), rel=1e-4)
    for n, p in model.named_parameters():
        assert_close(g_ent[n] - g_pg[n], p.grad, atol=1e-6, rtol=1e-3, msg=n)
    assert any(float(p.grad.abs().sum()) > 0 for p in model.parameters())


def test_memory_options_change_how_the_gradient_is_computed_not_its_value(tiny_model_dir, monkeypatch):
    """train.logprob_chunk (log-softmax over a few positions at a time) and train.gradient_checkpointing
    (activations recomputed in the backward) trade speed for memory: the gradient stays the same."""
    from rollwise.training import policy

    ov = ["train.micro_batch_size=16", NO_CLIP]
    g, m, _ = _grads(tiny_model_dir, ov)
    chunks = []
    real = policy.response_logprobs
    monkeypatch.setattr(policy, "response_logprobs", lambda *a, **k: chunks.append(a[3]) or real(*a, **k))
    for extra in (["train.logprob_chunk=2"], ["train.gradient_checkpointing=true"]):
        g2, m2, _ = _grads(tiny_model_dir, [*ov, *extra])
        assert m2["loss/policy"] == pytest.approx(m["loss/policy"], rel=1e-5)
        for n in g:
            assert_close(g2[n], g[n], atol=1e-6, rtol=1e-4, msg=f"{extra} {n}")
    assert chunks[0] == 2 and chunks[-1] != 2  # the chunk reached the log-prob computation
    for on in (True, False):
        cfg = load_config(None, ["model.dtype=float32", f"train.gradient_checkpointing={str(on).lower()}"])
        assert PolicyTrainer(cfg, load_model(str(tiny_model_dir)), pad_id=0).model.is_gradient_checkpointing is on


def test_the_trainer_takes_the_advantage_estimator_and_scaling_from_the_config(tiny_model_dir):
    model = load_model(str(tiny_model_dir))

    def advantages(*overrides):
        samples = _samples()
        PolicyTrainer(load_config(None, ["model.dtype=float32", *overrides]), model, pad_id=0).compute_advantages(samples)
        return [round(s.advantage, 4) for s in samples[:4]]  # group a: rewards 1, 0, 0, 1

    assert advantages("algo.advantage=rloo") == [0.6667, -0.6667, -0.6667, 0.6667]  # r - mean of the other three
    assert advantages("algo.scale_rewards=none") == [0.5, -0.5, -0.5, 0.5]  # Dr.GRPO: r - group mean
    assert advantages()[0] > 0.5  # the default divides by the group's standard deviation


def test_later_iterations_clip_against_the_weights_at_the_start_of_the_update(tiny_model_dir):
    """With algo.num_iterations=2 the second pass compares with the log-probs frozen at the first
    (PPO's proximal policy): after one large step many tokens leave a tight clip range, so the clip
    fraction is positive; a wide range (algo.epsilon reaching the loss) clips nothing."""
    def run(*overrides):
        cfg = load_config(None, ["model.dtype=float32", "train.micro_batch_size=16", "train.learning_rate=0.05",
                                 "train.warmup_steps=0", "algo.num_iterations=2", "train.max_grad_norm=1e9", *overrides])
        torch.manual_seed(0)
        model = load_model(str(tiny_model_dir))
        tr = PolicyTrainer(cfg, model, pad_id=0)
        norms, step = [], tr.optimizer.step
        tr.optimizer.step = lambda: (norms.append(math.sqrt(sum(float(p.grad.pow(2).sum())
                                                                 for p in model.parameters() if p.grad is not None))),
                                     step())
        samples = _samples()
        tr.compute_advantages(samples)
        return tr.update(samples), norms

    tight, norms = run("algo.epsilon=0.001", "algo.epsilon_high=0.001")
    # were the proximal log-probs taken again at the second pass, its ratio would be 1 and nothing clipped
    assert len(norms) == 2 and tight["loss/clip_frac"] > 0.2 and tight["loss/ratio_mean"] != pytest.approx(1.0)
    assert norms[1] != pytest.approx(norms[0], rel=1e-3)  # the second pass saw moved weights
    wide, _ = run("algo.epsilon=0.99", "algo.epsilon_high=1000")
    assert wide["loss/clip_frac"] == 0 and wide["loss/ratio_mean"] == pytest.approx(tight["loss/ratio_mean"], abs=0.5)
    once, _ = run("algo.num_iterations=1", "algo.epsilon=0.001", "algo.epsilon_high=0.001")
    assert once["loss/clip_frac"] == 0  # one pass: the ratio is 1 everywhere


def test_a_lora_policy_reaches_the_engine_as_merged_weights_under_the_base_names(tiny_model_dir):
    """What every LoRA step sends to the rollout engine (merged_state_dict): the base model's keys,
    holding base + B A x scale (what peft's merge_and_unload gives), and the adapters left unmerged."""
    from rollwise.engine import HFEngine
    from rollwise.models import merged_state_dict

    cfg = load_config(None, ["model.dtype=float32", "model.lora.enabled=true", "model.lora.r=4"])
    base_sd = {k: v.clone() for k, v in load_model(str(tiny_model_dir)).state_dict().items()}
    model = apply_lora(load_model(str(tiny_model_dir)), cfg.model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)  # B starts at 0: make the adapters matter
    sd = merged_state_dict(model)
    assert sd.keys() == base_sd.keys()
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    for k in sd:
        assert_close(sd[k], expected[k], atol=1e-6, rtol=1e-5, msg=k)
    assert any(not torch.equal(sd[k], base_sd[k]) for k in sd if "q_proj" in k)  # the adapters moved them
    for n, p in model.named_parameters():  # the frozen base untouched, bit for bit (a merge and unmerge left
        if "base_layer" in n:  # W + BA - BA, which drifted with every step's sync)
            assert torch.equal(p, base_sd[n.replace("base_model.model.", "").replace(".base_layer", "")]), n
    engine = HFEngine(load_model(str(tiny_model_dir)), [1], 0, torch.float32, 4, 1.0, 0, 0)
    engine.load_weights(sd, 1)  # every key lands in the engine's copy
    got = {k: v for k, v in engine.model.state_dict().items()}
    assert set(sd) <= set(got), set(sd) - set(got)
    bad = [k for k in sd if not torch.equal(got[k].float(), sd[k])]
    assert not bad, bad


def test_lora_names_no_module_has_or_a_tied_embedding_are_refused(tiny_model_dir):
    from rollwise.models import ModelError

    def lora(*modules):
        cfg = load_config(None, ["model.lora.enabled=true", f"model.lora.target_modules=[{', '.join(modules)}]"])
        return apply_lora(load_model(str(tiny_model_dir)), cfg.model)

    with pytest.raises(ModelError, match=r"names nope, which no module of this model has; its linear layers: .*q_proj"):
        lora("q_proj", "nope")  # peft adapted q_proj alone without a word
    assert load_model(str(tiny_model_dir)).config.tie_word_embeddings  # as SmolLM2's
    with pytest.raises(ModelError, match="shares its weight with the model's other embedding"):
        lora("lm_head")


def test_the_gpu_rng_travels_in_checkpoints_where_there_is_one(monkeypatch):
    """LoRA dropout on a GPU draws from the CUDA generator: rng_state saves it and set_rng_state puts it
    back (stand-in torch.cuda functions; this machine has no GPU)."""
    from rollwise.training.checkpoint import rng_state, set_rng_state

    held = {"state": [torch.tensor([1, 2], dtype=torch.uint8)]}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(held["state"]))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: held.update(state=list(s)))
    saved = rng_state()
    assert saved["cuda"][0].tolist() == [1, 2]
    held["state"] = [torch.tensor([9, 9], dtype=torch.uint8)]
    set_rng_state(saved)
    assert held["state"][0].tolist() == [1, 2]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # another machine: left as it is
    held["state"] = [torch.tensor([9, 9], dtype=torch.uint8)]
    set_rng_state(saved)
    assert held["state"][0].tolist() == [9, 9]


def test_a_resume_that_changes_num_iterations_or_the_token_budget_keeps_the_schedules_place(tiny_model_dir):
    """The scheduler counts updates and the decay's start is a share of the token budget: a resume that
    changed algo.num_iterations or train.max_rollout_tokens made the rate jump."""
    ov = ["model.dtype=float32", "train.warmup_steps=0", "train.lr_scheduler=linear", "train.max_steps=20"]
    tr = PolicyTrainer(load_config(None, ov), load_model(str(tiny_model_dir)), pad_id=0)
    for _ in range(10):  # step 10 of 20, one update a step
        tr.optimizer.step()
        tr.scheduler.step()
    again = PolicyTrainer(load_config(None, [*ov, "algo.num_iterations=2"]), load_model(str(tiny_model_dir)), pad_id=0)
    again.load_state_dict(tr.state_dict())
    assert again.scheduler.last_epoch == 20 and again._apply_lr(0.0) == pytest.approx(tr._apply_lr(0.0))
    ov = ["model.dtype=float32", "train.warmup_steps=2", "train.lr_scheduler=linear", "train.max_steps=100"]
    tr = PolicyTrainer(load_config(None, [*ov, "train.max_rollout_tokens=10000"]), load_model(str(tiny_model_dir)),
                       pad_id=0)
    tr._decay_from = 0.2  # the decay began at 2000 tokens
    again = PolicyTrainer(load_config(None, [*ov, "train.max_rollout_tokens=20000"]), load_model(str(tiny_model_dir)),
                          pad_id=0)
    again.load_state_dict(tr.state_dict())
    assert again._decay_from == pytest.approx(0.1)  # still 2000 tokens


def test_advantage_abs_mean_is_over_trained_samples_not_replayed_anchors(tiny_model_dir):
    # group a: three wrong and one replayed correct anchor: rewards 0,0,0,1 -> mean 1/4, std (unbiased) 1/2:
    # advantages -0.5 (x3, trained) and 1.5 (the anchor); over trained samples the mean |A| is 0.5, not 0.75
    samples = [Sample("a", 0, [5, 6], [7], [0.0], [0], "stop", reward=r) for r in (0.0, 0.0, 0.0, 1.0)]
    samples[3].stop_gradient = True
    tr = PolicyTrainer(load_config(None, ["model.dtype=float32"]), load_model(str(tiny_model_dir)), pad_id=0)
    assert tr.compute_advantages(samples)["train/advantage_abs_mean"] == pytest.approx(0.5, abs=1e-3)
