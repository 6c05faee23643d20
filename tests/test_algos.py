"""Hand-computed checks of rollwise.algos: every expected value below is worked out in the
comments next to it, not produced by the code under test."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run without install

from rollwise.algos import (
    ADVANTAGES,
    POLICY_LOSSES,
    aggregate_loss,
    cispo_loss,
    entropy_from_logits,
    get_advantage_fn,
    get_policy_loss,
    grpo_advantages,
    gspo_loss,
    kl_penalty,
    masked_mean,
    ppo_clip_loss,
    reinforce_pp_advantages,
    rloo_advantages,
)

F64 = torch.float64


def t(*rows: object) -> torch.Tensor:
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=F64)


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


# ----------------------------------------------------------------------------- advantages


def test_grpo_group_scale_one_group() -> None:
    # rewards [1, 0, 0, 1]: mean .5; deviations ±.5, unbiased var = 4 * .25 / 3 = 1/3,
    # std = 0.5773502691896258 -> A = ±0.5 / (0.5773502691896258 + 1e-4)
    a = 0.5 / (0.5773502691896258 + 1e-4)
    out = grpo_advantages(t([1.0, 0.0, 0.0, 1.0]), ids(0, 0, 0, 0))
    assert_close(out, t([a, -a, -a, a]))


def test_grpo_noncontiguous_unequal_groups_and_singleton() -> None:
    # group 7 = idx 0, 2, 4 with rewards 1, 0, 3: mean 4/3, deviations -1/3, -4/3, 5/3,
    #   squares 1/9 + 16/9 + 25/9 = 42/9, / 2 -> var 7/3, std 1.5275252316519468
    # group 3 = idx 1, 5 with rewards 5, 2: mean 3.5, deviations ±1.5, var 4.5, std 2.1213203435596424
    # group -9 = idx 3 alone -> 0
    s7, s3 = 1.5275252316519468 + 1e-4, 2.1213203435596424 + 1e-4
    out = grpo_advantages(t([1.0, 5.0, 0.0, 7.0, 3.0, 2.0]), ids(7, 3, 7, -9, 7, 3))
    assert_close(out, t([(-1 / 3) / s7, 1.5 / s3, (-4 / 3) / s7, 0.0, (5 / 3) / s7, -1.5 / s3]))


def test_grpo_all_equal_group_is_exactly_zero() -> None:
    # 0.1 * 3 in float32 has a rounding error in the mean; /(0 + 1e-4) would blow it up.
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0], dtype=torch.float32)
    out = grpo_advantages(r, ids(2, 2, 2, 5, 5))
    assert torch.equal(out[:3], torch.zeros(3))
    # group 5: rewards 1, 0 -> mean .5, std sqrt(.5) = 0.7071067811865476
    a = 0.5 / (0.7071067811865476 + 1e-4)
    assert_close(out[3:], torch.tensor([a, -a], dtype=torch.float32))
    for fn in (rloo_advantages, reinforce_pp_advantages):
        assert torch.equal(fn(r, ids(2, 2, 2, 5, 5))[:3], torch.zeros(3))


def test_grpo_singletons_only() -> None:
    out = grpo_advantages(t([3.0, -1.0]), ids(0, 1))
    assert torch.equal(out, t([0.0, 0.0]))
    for scale in ("batch", "none"):
        assert torch.equal(grpo_advantages(t([4.0]), ids(0), scale=scale), t([0.0]))


def test_grpo_batch_scale() -> None:
    # rewards [1,0,0,1 | 2,2]; group-centred: [.5,-.5,-.5,.5, 0,0]
    # batch std of rewards: mean 1, deviations 0,-1,-1,0,1,1 -> sum sq 4, / 5 = .8,
    # std = 0.894427190999916 ; the all-equal group stays 0
    s = 0.894427190999916 + 1e-4
    out = grpo_advantages(t([1.0, 0.0, 0.0, 1.0, 2.0, 2.0]), ids(0, 0, 0, 0, 1, 1), "batch")
    assert_close(out, t([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0]))


def test_grpo_no_scale_is_dr_grpo() -> None:
    # group means 0.5 and 2 (idx 1, 3: rewards 3, 1) -> plain differences
    out = grpo_advantages(t([1.0, 3.0, 0.0, 1.0]), ids(0, 1, 0, 1), scale="none")
    assert_close(out, t([0.5, 1.0, -0.5, -1.0]))


def test_grpo_eps_and_bad_scale() -> None:
    out = grpo_advantages(t([1.0, 0.0]), ids(0, 0), eps=0.0)  # std sqrt(.5)
    assert_close(out, t([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)]))
    with pytest.raises(ValueError, match="scale"):
        grpo_advantages(t([1.0, 0.0]), ids(0, 0), scale="std")  # type: ignore[arg-type]


def test_advantage_input_validation() -> None:
    with pytest.raises(ValueError, match="integer"):
        grpo_advantages(t([1.0, 0.0]), t([0.0, 0.0]))
    with pytest.raises(ValueError, match="shape"):
        rloo_advantages(t([1.0, 0.0]), ids(0))
    with pytest.raises(ValueError, match="finite"):
        grpo_advantages(t([1.0, float("nan")]), ids(0, 0))
    assert grpo_advantages(t([]), ids()).shape == (0,)
    # integer rewards are promoted to float
    assert_close(rloo_advantages(ids(1, 0), ids(0, 0)), torch.tensor([1.0, -1.0]))


def test_rloo() -> None:
    # [1,0,0,1]: 1 - mean(0,0,1) = 2/3 ; 0 - mean(1,0,1) = -2/3
    out = rloo_advantages(t([1.0, 0.0, 0.0, 1.0]), ids(4, 4, 4, 4))
    assert_close(out, t([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    # group 7 (1, 0, 3): 1 - 1.5 = -.5 ; 0 - 2 = -2 ; 3 - .5 = 2.5
    # group 3 (5, 2): 5 - 2 = 3 ; 2 - 5 = -3 ; group -9 singleton -> 0
    out = rloo_advantages(t([1.0, 5.0, 0.0, 7.0, 3.0, 2.0]), ids(7, 3, 7, -9, 7, 3))
    assert_close(out, t([-0.5, 3.0, -2.0, 0.0, 2.5, -3.0]))


def test_reinforce_pp_whitening_keeps_zero_groups_zero() -> None:
    # rewards [1,0,0,1 | 3,1 | 5 | 2,2]; centred [.5,-.5,-.5,.5, 1,-1, 0, 0,0]
    # active entries (first six): mean 0, unbiased var (4*.25 + 2*1) / 5 = .6,
    # std 0.7745966692414834 -> x / (0.7745966692414834 + 1e-8); zero groups stay 0
    s = 0.7745966692414834 + 1e-8
    r = t([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 5.0, 2.0, 2.0])
    out = reinforce_pp_advantages(r, ids(0, 0, 0, 0, 1, 1, 2, 3, 3))
    assert_close(out, t([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 1 / s, -1 / s, 0.0, 0.0, 0.0]))
    assert torch.equal(out[6:], t([0.0, 0.0, 0.0]))


def test_reinforce_pp_subtracts_batch_mean_and_zero_entry() -> None:
    # group 0: (0, 1, 2) centred (-1, 0, 1); group 1: (0, 4) centred (-2, 2)
    # active mean 0, var (1 + 0 + 1 + 4 + 4) / 4 = 2.5, std 1.5811388300841898
    s = 1.5811388300841898 + 1e-8
    out = reinforce_pp_advantages(t([0.0, 1.0, 2.0, 0.0, 4.0]), ids(0, 0, 0, 1, 1))
    assert_close(out, t([-1 / s, 0.0, 1 / s, -2 / s, 2 / s]))


def test_reinforce_pp_zero_groups_stay_zero_despite_rounding() -> None:
    # group 0: (.1, .2, .7), mean 1/3 -> centred -7/30, -4/30, 11/30, whose float mean is
    # ~1.9e-17, not 0. std = sqrt((49 + 16 + 121) / 900 / 2) = 0.32145502536643183.
    # Groups 1 (all equal) and 2 (singleton) must stay exactly 0, not -1.9e-17 / std.
    s = 0.32145502536643183 + 1e-8
    out = reinforce_pp_advantages(t([0.1, 0.2, 0.7, 0.3, 0.3, 0.9]), ids(0, 0, 0, 1, 1, 2))
    assert_close(out[:3], t([-7 / 30 / s, -4 / 30 / s, 11 / 30 / s]))
    assert torch.equal(out[3:], t([0.0, 0.0, 0.0]))


def test_reinforce_pp_skips_whitening_without_signal() -> None:
    out = reinforce_pp_advantages(t([1.0, 1.0, 3.0]), ids(0, 0, 1))
    assert torch.equal(out, t([0.0, 0.0, 0.0]))


# ----------------------------------------------------------------------------- policy losses


def _ratios(ratios: list[list[float]], old: float = -1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """logp (leaf, requires grad) and old_logp such that exp(logp - old_logp) = ratios."""
    old_logp = torch.full((len(ratios), len(ratios[0])), old, dtype=F64)
    logp = (old_logp + torch.log(t(ratios))).detach().requires_grad_(True)
    return logp, old_logp


def test_ppo_clip_values_grads_and_metrics() -> None:
    # row 0, A=+2: r=1.1 in range -> -2.2 ; r=1.5 > 1.2 -> -2*1.2 = -2.4 (clipped, no grad)
    #   r=0.5 < 0.8 but A>0 -> min(1.0, 1.6) = 1.0 -> -1.0 (not clipped) ; r=3.0 masked -> 0
    # row 1, A=-1: r=0.9 -> 0.9 ; r=0.5 -> -min(-.5, -.8) = 0.8 (clipped)
    #   r=1.5 -> -min(-1.5, -1.2) = 1.5 (not clipped) ; r=1.0 -> 1.0
    logp, old = _ratios([[1.1, 1.5, 0.5, 3.0], [0.9, 0.5, 1.5, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    loss, met = ppo_clip_loss(logp, old, t([2.0, -1.0]), mask)
    assert_close(loss, t([[-2.2, -2.4, -1.0, 0.0], [0.9, 0.8, 1.5, 1.0]]))
    loss.sum().backward()
    # d loss / d logp = -A * ratio where unclipped, 0 where clipped or masked
    assert_close(logp.grad, t([[-2.2, 0.0, -1.0, 0.0], [0.9, 0.0, 1.5, 1.0]]))
    assert_close(met["clip_frac"], t(2 / 7))
    assert_close(met["ratio_mean"], t(1.0))  # (1.1+1.5+.5+.9+.5+1.5+1) / 7 = 7/7
    logs = [1.1, 1.5, 0.5, 0.9, 0.5, 1.5, 1.0]
    assert_close(met["approx_kl"], t(-sum(math.log(x) for x in logs) / 7))  # 0.0836306
    assert_close(met["dual_clip_frac"], t(0.0))
    assert all(not v.requires_grad for v in met.values())


def test_ppo_clip_asymmetric_epsilon_high() -> None:
    # eps .2 / eps_high .28. A=+1: r=1.25 -> -1.25 (would be -1.2 symmetric);
    #   r=1.3 -> -1.28 ; r=0.7 -> -0.7. A=-1: r=0.7 -> 0.8 (lower clip still .8);
    #   r=1.25 -> 1.25 ; r=1.3 -> 1.3
    logp, old = _ratios([[1.25, 1.3, 0.7], [0.7, 1.25, 1.3]])
    loss, met = ppo_clip_loss(logp, old, t([1.0, -1.0]), torch.ones(2, 3), 0.2, 0.28)
    assert_close(loss, t([[-1.25, -1.28, -0.7], [0.8, 1.25, 1.3]]))
    assert_close(met["clip_frac"], t(2 / 6))


def test_ppo_dual_clip() -> None:
    # c=3, A=-1: r=2 -> min(2, 3) = 2 ; r=4 -> min(4, 3) = 3 ; r=10 -> 3 (dual clipped)
    # A=+1 is untouched by the dual clip: r=4 -> -1.2 ; r=2 -> -1.2 ; r=1 -> -1
    logp, old = _ratios([[2.0, 4.0, 10.0], [4.0, 2.0, 1.0]])
    loss, met = ppo_clip_loss(logp, old, t([-1.0, 1.0]), torch.ones(2, 3), dual_clip=3.0)
    assert_close(loss, t([[2.0, 3.0, 3.0], [-1.2, -1.2, -1.0]]))
    loss.sum().backward()
    assert_close(logp.grad, t([[2.0, 0.0, 0.0], [0.0, 0.0, -1.0]]))
    assert_close(met["dual_clip_frac"], t(2 / 6))
    assert_close(met["clip_frac"], t(2 / 6))  # the two A=+1 tokens above 1.2
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip_loss(logp, old, t([-1.0, 1.0]), torch.ones(2, 3), dual_clip=1.0)


def test_ppo_on_policy_gradient_with_undetached_old_logp() -> None:
    # old_logp = logp (not detached): ratio 1, gradient -A on every token
    logp = t([[-0.3, -2.0]]).requires_grad_(True)
    loss, _ = ppo_clip_loss(logp, logp, t([0.5]), torch.ones(1, 2))
    loss.sum().backward()
    assert_close(logp.grad, t([[-0.5, -0.5]]))


def test_gspo_sequence_ratio_value_and_per_token_gradient() -> None:
    old = t([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0], [-0.4, -0.2, -3.0], [-1.0, -1.0, -1.0]])
    delta = t([[0.1, -0.1, 4.0], [0.05, 0.15, 0.0], [0.1, 0.3, 0.0], [0.7, 0.7, 0.7]])
    mask = t([[1, 1, 0], [1, 1, 0], [1, 1, 0], [0, 0, 0]])
    logp = (old + delta).requires_grad_(True)
    # row 0, A=1: s = (.1 - .1)/2 = 0 -> ratio 1 -> loss -1 per token (the masked 4.0 is ignored)
    # row 1, A=-.5: s = .1 -> ratio e^.1 = 1.1051709180756477 (in range) -> .5 * 1.10517...
    # row 2, A=2: s = .2 -> ratio e^.2 = 1.2214027581601699 > 1.2 -> -2 * 1.2, no grad
    # row 3: empty -> 0
    e1 = 1.1051709180756477
    loss, met = gspo_loss(logp, old, t([1.0, -0.5, 2.0, 3.0]), mask)
    assert_close(loss, t([[-1.0, -1.0, 0.0], [0.5 * e1] * 2 + [0.0], [-2.4, -2.4, 0.0], [0.0] * 3]))
    loss.sum().backward()
    # d/d logp_t = -A * exp(s) on each token (not divided by the length: flows per token)
    g = t([[-1.0, -1.0, 0.0], [0.5 * e1, 0.5 * e1, 0.0], [0.0] * 3, [0.0] * 3])
    assert_close(logp.grad, g)
    # token-weighted sequence ratio: (2*1 + 2*e^.1 + 2*e^.2) / 6
    assert_close(met["ratio_mean"], t((2 + 2 * e1 + 2 * 1.2214027581601699) / 6))
    assert_close(met["clip_frac"], t(2 / 6))


def test_cispo_value_and_gradient() -> None:
    # cap 1 + eps_high = 1.2. Row 0, A=1: logp -.5, -1 ; delta .1, 1 -> ratio 1.10517, e (capped 1.2)
    #   loss -w A logp = .5 * 1.10517 = 0.5525854590378239, 1.2 ; grad -w A = -1.10517, -1.2
    # Row 1, A=-2: logp -1.5, -3 ; delta -.5, 0 -> ratio e^-.5 = 0.6065306597126334 (no lower
    #   clip), 1 -> loss 2 w logp = -1.8195919791379003, -6 ; grad -w A = 1.2130613194252668, 2
    logp = t([[-0.5, -1.0], [-1.5, -3.0]]).requires_grad_(True)
    old = t([[-0.6, -2.0], [-1.0, -3.0]])
    loss, met = cispo_loss(logp, old, t([1.0, -2.0]), torch.ones(2, 2))
    assert_close(loss, t([[0.5525854590378239, 1.2], [-1.8195919791379003, -6.0]]))
    loss.sum().backward()
    assert_close(logp.grad, t([[-1.1051709180756477, -1.2], [1.2130613194252668, 2.0]]))
    assert_close(met["clip_frac"], t(0.25))


def test_policy_loss_shape_errors() -> None:
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(logp, logp, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask"):
        gspo_loss(logp, logp, torch.zeros(2), torch.ones(2, 2))
    # per-token advantages [B, L] are accepted
    loss, _ = cispo_loss(logp, logp, torch.ones(2, 3), torch.ones(2, 3))
    assert loss.shape == (2, 3)


# ----------------------------------------------------------------------------- KL, entropy


def test_kl_estimators() -> None:
    # d = logp - ref = [.5, -1, 0, 50, -50]
    logp = t([-1.0, -2.0, -0.5, 0.0, -50.0]).requires_grad_(True)
    ref = t([-1.5, -1.0, -0.5, -50.0, 0.0])
    assert_close(kl_penalty(logp, ref, "k1"), t([0.5, -1.0, 0.0, 50.0, -50.0]))
    assert_close(kl_penalty(logp, ref, "k2"), t([0.125, 0.5, 0.0, 1250.0, 1250.0]))
    # k3 = e^x - x - 1, x = clamp(-d, ±20): x=-.5 -> 0.6065306597126334 + .5 - 1 ;
    #   x=1 -> e - 2 ; x=0 -> 0 ; x=-20 -> 2.061153622438558e-09 + 19 ; x=20 -> e^20 - 21
    k3 = kl_penalty(logp, ref, "k3")
    expected = [0.1065306597126334, 0.718281828459045, 0.0, 19.000000002061153, 485165174.4097903]
    assert_close(k3, t(expected))
    k3[:3].sum().backward()  # d k3 / d logp = 1 - e^-d : 1 - 0.60653, 1 - e, 0
    assert_close(logp.grad, t([0.3934693402873666, -1.718281828459045, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(logp, ref, "low_var")  # type: ignore[arg-type]


def test_entropy_three_token_vocab() -> None:
    # softmax([ln2, 0, 0]) = [.5, .25, .25]: H = .5 ln2 + 2 * .25 ln4 = 1.5 ln2
    # uniform -> ln3 ; [0, 0, -inf] -> ln2 ; shift by 10 changes nothing
    ln2 = math.log(2.0)
    logits = t([[[ln2, 0.0, 0.0], [0.0, 0.0, 0.0]], [[10 + ln2, 10.0, 10.0], [0.0, 0.0, -math.inf]]])
    expected = t([[1.5 * ln2, math.log(3.0)], [1.5 * ln2, ln2]])
    assert_close(entropy_from_logits(logits), expected)
    assert_close(entropy_from_logits(logits, chunk_size=3), expected)
    leaf = logits.clone().requires_grad_(True)
    entropy_from_logits(leaf, chunk_size=1).sum().backward()
    assert torch.isfinite(leaf.grad).all()
    # dH/dz_k = -p_k (z_k - sum_j p_j z_j): uniform row -> 0
    assert_close(leaf.grad[0, 1], t([0.0, 0.0, 0.0]))
    out16 = entropy_from_logits(logits.to(torch.bfloat16)[:, :, :])
    assert out16.dtype == torch.bfloat16 and out16.shape == (2, 2)


# ----------------------------------------------------------------------------- aggregation

LOSS = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, math.nan]]
MASK = [[1, 1, 0], [1, 0, 0], [0, 0, 0]]  # masked sum 1 + 2 + 4 = 7 over 3 tokens


@pytest.mark.parametrize(
    ("loss_type", "kwargs", "expected"),
    [
        ("dapo", {}, 7 / 3),
        ("dapo", {"num_tokens": 10}, 0.7),
        ("grpo", {}, (1.5 + 4.0 + 0.0) / 3),  # row means 1.5, 4, empty row 0; B = 3
        ("grpo", {"num_sequences": 5}, 5.5 / 5),
        ("dr_grpo", {"max_completion_length": 4}, 7 / (3 * 4)),
        ("dr_grpo", {"max_completion_length": 4, "num_sequences": 7}, 7 / (7 * 4)),
    ],
)
def test_aggregate_values(loss_type: str, kwargs: dict, expected: float) -> None:
    # the NaN sits at a masked position and must not leak into the value
    out = aggregate_loss(t(LOSS), t(MASK).bool(), loss_type, **kwargs)  # type: ignore[arg-type]
    assert_close(out, t(expected))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("normalisers", [{}, {"num_tokens": 0, "num_sequences": 0}])
def test_aggregate_empty_mask_is_zero_with_grad(loss_type: str, normalisers: dict) -> None:
    loss = t([[1.0, 2.0], [3.0, 4.0]]).requires_grad_(True)
    out = aggregate_loss(loss, torch.zeros(2, 2), loss_type, 8, **normalisers)  # type: ignore[arg-type]
    assert out.item() == 0.0 and out.grad_fn is not None
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(2, 2, dtype=F64))


def test_aggregate_errors() -> None:
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate_loss(t(LOSS), t(MASK), "dr_grpo")
    with pytest.raises(ValueError, match="grpo, dapo, dr_grpo"):
        aggregate_loss(t(LOSS), t(MASK), "seq-mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mask shape"):
        aggregate_loss(t(LOSS), torch.ones(3, 2), "dapo")
    with pytest.raises(ValueError, match="num_tokens"):
        aggregate_loss(t(LOSS), t(MASK), "dapo", num_tokens=-1)
    # a zero normaliser with tokens to divide was taken for 1 (the loss 7 instead of an error)
    with pytest.raises(ValueError, match="num_tokens=0"):
        aggregate_loss(t(LOSS), t(MASK), "dapo", num_tokens=0)
    with pytest.raises(ValueError, match="num_sequences=0"):
        aggregate_loss(t(LOSS), t(MASK), "grpo", num_sequences=0)


def test_entropy_of_a_row_with_no_finite_logit_is_zero_not_nan() -> None:
    logits = t([[[0.0, math.log(3.0)], [-math.inf, -math.inf]]])
    assert_close(entropy_from_logits(logits)[0, 1], t(0.0))


def test_masked_mean() -> None:
    x = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = t([[1, 0, 1], [0, 0, 0]])
    assert_close(masked_mean(x, m), t(2.0))  # (1 + 3) / 2
    assert_close(masked_mean(x, m, dim=-1), t([2.0, 0.0]))  # empty row -> 0
    assert masked_mean(x, torch.zeros(2, 3)).item() == 0.0


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("drop_zero_adv", [False, True])
def test_micro_batches_sum_to_whole_batch(loss_type: str, drop_zero_adv: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    b, length = 7, 5
    old = -torch.rand(b, length, generator=gen, dtype=F64) * 3  # [B, L]
    logp = (old + 0.3 * torch.randn(b, length, generator=gen, dtype=F64)).requires_grad_(True)
    adv = t([1.5, 0.0, -0.7, 2.0, 0.0, -1.2, 0.4])  # rows 1 and 4 have A = 0 exactly
    lengths = torch.tensor([5, 3, 1, 0, 4, 2, 5])  # row 3 has no tokens
    mask = torch.arange(length)[None, :] < lengths[:, None]  # [B, L]
    kw = {"max_completion_length": length}

    loss, _ = ppo_clip_loss(logp, old, adv, mask)
    whole = aggregate_loss(loss, mask, loss_type, **kw)  # type: ignore[arg-type]
    (grad_whole,) = torch.autograd.grad(whole, logp)

    rows = [i for i in range(b) if not (drop_zero_adv and adv[i] == 0)]
    chunks = [rows[:2], rows[2:3], rows[3:]]  # uneven micro-batches
    total_tokens, total_seqs = mask.sum(), b  # of the WHOLE batch, dropped rows included
    acc = torch.zeros((), dtype=F64)
    for idx in chunks:
        sel = torch.tensor(idx)
        micro, _ = ppo_clip_loss(logp[sel], old[sel], adv[sel], mask[sel])
        acc = acc + aggregate_loss(
            micro, mask[sel], loss_type, num_tokens=total_tokens, num_sequences=total_seqs, **kw
        )  # type: ignore[arg-type]
    (grad_micro,) = torch.autograd.grad(acc, logp)
    assert_close(acc, whole)
    assert_close(grad_micro, grad_whole)
    assert grad_whole.abs().sum() > 0


# ----------------------------------------------------------------------------- registries


def test_registries() -> None:
    assert ADVANTAGES == {
        "grpo": grpo_advantages,
        "rloo": rloo_advantages,
        "reinforce_pp": reinforce_pp_advantages,
    }
    assert POLICY_LOSSES == {"ppo_clip": ppo_clip_loss, "gspo": gspo_loss, "cispo": cispo_loss}
    assert get_advantage_fn("rloo") is rloo_advantages
    assert get_policy_loss("gspo") is gspo_loss
    with pytest.raises(ValueError, match="grpo, reinforce_pp, rloo"):
        get_advantage_fn("gae")
    with pytest.raises(ValueError, match="cispo, gspo, ppo_clip"):
        get_policy_loss("sapo")
