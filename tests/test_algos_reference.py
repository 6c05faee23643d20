"""Reference checks of rollwise.algos against the published formulas (DeepSeekMath GRPO, DAPO,
Dr.GRPO, GSPO, RLOO, CISPO, Schulman's k1/k2/k3, TIS / decoupled PPO / IcePop / M2PO).

Every expected number is worked out by hand in the comments (float64 inputs); gradients are
checked with torch.autograd against the analytic derivative of the formula.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run without install

from rollwise.algos import (
    aggregate_loss,
    cispo_loss,
    decoupled_correction,
    entropy_from_logits,
    grpo_advantages,
    gspo_loss,
    icepop_correction,
    kl_penalty,
    m2po_correction,
    mask_resumed_correction,
    masked_mean,
    ppo_clip_loss,
    reinforce_pp_advantages,
    rloo_advantages,
    speculative_accept_batch,
    tis_correction,
)
from rollwise.algos.speculative import residual_distribution

F64 = torch.float64
SQRT3 = math.sqrt(3.0)


def t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


def leaf(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=F64, requires_grad=True)


# ============================================================================ advantages
# rewards: group 7 = [1, 0, 0] (non-contiguous: positions 0, 2, 4), group 3 = [0.5] (singleton),
# group 9 = [2, 2] (all equal), group 1 = [3, 1]
REWARDS = [1.0, 0.5, 0.0, 2.0, 0.0, 2.0, 3.0, 1.0]
GIDS = [7, 3, 7, 9, 7, 9, 1, 1]


def test_grpo_group_scale_hand_values() -> None:
    # group 7: mean 1/3; deviations 2/3, -1/3, -1/3; sum of squares 6/9; unbiased var (6/9)/2 = 1/3
    # -> std 1/sqrt(3); A = (2/3) * sqrt(3) = 2/sqrt(3), -1/sqrt(3), -1/sqrt(3)   (eps = 0)
    # group 1: mean 2, deviations +1, -1; unbiased var 2/1 = 2; std sqrt(2): A = +-1/sqrt(2)
    # singleton and all-equal groups: 0
    a = grpo_advantages(t(REWARDS), torch.tensor(GIDS), scale="group", eps=0.0)
    r2 = 1 / math.sqrt(2)
    assert_close(a, t([2 / SQRT3, 0.0, -1 / SQRT3, 0.0, -1 / SQRT3, 0.0, r2, -r2]))


def test_grpo_group_scale_with_trl_eps() -> None:
    # TRL: (r - mean) / (std + 1e-4); group 7: (2/3) / (0.5773502692 + 1e-4) = 1.1545006...
    a = grpo_advantages(t([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]))
    s = 1 / SQRT3 + 1e-4
    assert_close(a, t([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s]))


def test_dr_grpo_advantage_has_no_std_scaling() -> None:
    # Dr.GRPO: A = r - mean_g; group 7: 2/3, -1/3, -1/3; group 1: +1, -1
    a = grpo_advantages(t(REWARDS), torch.tensor(GIDS), scale="none")
    assert_close(a, t([2 / 3, 0.0, -1 / 3, 0.0, -1 / 3, 0.0, 1.0, -1.0]))


def test_grpo_batch_scale_hand_values() -> None:
    # rewards [1, 0, 0] (group 0) and [3, 1] (group 1): batch mean 1, deviations 0,-1,-1,2,0
    # sum of squares 6, unbiased var 6/4 = 1.5, std sqrt(1.5) = 1.2247448714
    # A = (r - group mean) / std: group 0: (2/3, -1/3, -1/3) / 1.2247; group 1: (1, -1) / 1.2247
    a = grpo_advantages(t([1.0, 0.0, 0.0, 3.0, 1.0]), torch.tensor([0, 0, 0, 1, 1]), scale="batch", eps=0.0)
    s = math.sqrt(1.5)
    assert_close(a, t([2 / 3 / s, -1 / 3 / s, -1 / 3 / s, 1 / s, -1 / s]))


def test_group_of_one_and_all_equal_groups_give_exact_zero() -> None:
    for fn in (grpo_advantages, rloo_advantages, reinforce_pp_advantages):
        assert fn(t([0.7]), torch.tensor([0])).tolist() == [0.0]
        # three rewards of 0.1: their float mean is not exactly 0.1, std is ~1e-17; must be exact 0
        assert fn(t([0.1, 0.1, 0.1]), torch.tensor([4, 4, 4])).tolist() == [0.0, 0.0, 0.0]


def test_rloo_leave_one_out_hand_values() -> None:
    # group 7 [1, 0, 0]: A_0 = 1 - (0+0)/2 = 1; A_1 = 0 - (1+0)/2 = -0.5; A_2 = -0.5
    # group 1 [3, 1]: A = 3 - 1 = 2, 1 - 3 = -2; singleton / all-equal: 0 (verl's rloo gives r for a singleton)
    a = rloo_advantages(t(REWARDS), torch.tensor(GIDS))
    assert_close(a, t([1.0, 0.0, -0.5, 0.0, -0.5, 0.0, 2.0, -2.0]))
    # the RLOO identity A = n/(n-1) (r - mean)
    assert_close(a[[0, 2, 4]], 1.5 * t([2 / 3, -1 / 3, -1 / 3]))


def test_reinforce_pp_whitens_over_active_samples_only() -> None:
    # a = r - mean_g: group 7 (2/3, -1/3, -1/3), group 1 (+1, -1); singleton / equal groups stay 0
    # active values [2/3, -1/3, -1/3, 1, -1]: mean 0; squares 4/9 + 1/9 + 1/9 + 1 + 1 = 24/9
    # unbiased var (24/9)/4 = 2/3; std sqrt(2/3) = 0.8164965809
    a = reinforce_pp_advantages(t(REWARDS), torch.tensor(GIDS), eps=0.0)
    s = math.sqrt(2 / 3)
    assert_close(a, t([2 / 3 / s, 0.0, -1 / 3 / s, 0.0, -1 / 3 / s, 0.0, 1 / s, -1 / s]))


def test_advantages_do_not_depend_on_group_id_values_or_order() -> None:
    a = grpo_advantages(t([1.0, 0.0, 3.0, 1.0]), torch.tensor([100, 100, -5, -5]), eps=0.0)
    b = grpo_advantages(t([3.0, 1.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1]), eps=0.0)
    assert_close(a, b[[2, 3, 0, 1]])


# ============================================================================ aggregation
# loss [[1, 2, 3], [4, x, x], [x, x, x]], mask [[1,1,1], [1,0,0], [0,0,0]] (a zero-length response),
# x = garbage (inf / NaN) at masked positions
LOSS = [[1.0, 2.0, 3.0], [4.0, math.inf, math.nan], [math.nan, -math.inf, 5.0]]
MASK = [[1, 1, 1], [1, 0, 0], [0, 0, 0]]


@pytest.mark.parametrize(
    ("mode", "value", "grad"),
    [
        # DAPO token mean: S = 1+2+3+4 = 10 over 4 tokens; dS/dl = 1/4 on every token
        ("dapo", 2.5, [[0.25] * 3, [0.25, 0, 0], [0, 0, 0]]),
        # GRPO: row means 2, 4, 0 (empty row) -> (2+4+0)/3 = 2; d/dl = 1/(|o_b| * B): 1/9, 1/3
        ("grpo", 2.0, [[1 / 9] * 3, [1 / 3, 0, 0], [0, 0, 0]]),
        # Dr.GRPO with max_completion_length 4: 10 / (3 * 4); d/dl = 1/12 on every token
        ("dr_grpo", 10 / 12, [[1 / 12] * 3, [1 / 12, 0, 0], [0, 0, 0]]),
    ],
)
def test_aggregation_values_and_gradients(mode: str, value: float, grad: list[list[float]]) -> None:
    loss = leaf(LOSS)
    out = aggregate_loss(loss, torch.tensor(MASK), mode, max_completion_length=4)  # type: ignore[arg-type]
    assert_close(out, t(value))
    out.backward()
    assert loss.grad is not None
    assert_close(loss.grad, t(grad))


@pytest.mark.parametrize("mode", ["dapo", "grpo", "dr_grpo"])
def test_aggregation_micro_batches_sum_to_full_batch(mode: str) -> None:
    clean = [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    full = aggregate_loss(t(clean), torch.tensor(MASK), mode, max_completion_length=4)  # type: ignore[arg-type]
    parts = sum(
        aggregate_loss(t(clean)[rows], torch.tensor(MASK)[rows], mode, max_completion_length=4,  # type: ignore[arg-type]
                       num_tokens=4, num_sequences=3)
        for rows in ([0], [1, 2])
    )
    assert_close(parts, full)


@pytest.mark.parametrize("mode", ["dapo", "grpo", "dr_grpo"])
def test_aggregation_empty_mask_is_zero_with_zero_grad(mode: str) -> None:
    loss = leaf([[1.0, math.inf]])
    out = aggregate_loss(loss, torch.zeros(1, 2), mode, max_completion_length=2)  # type: ignore[arg-type]
    assert out.item() == 0.0
    out.backward()
    assert loss.grad is not None and loss.grad.tolist() == [[0.0, 0.0]]


def test_mixed_lengths_on_policy_gradient_under_each_mode() -> None:
    # on-policy PPO (old = logp): per-token loss -A * ratio with ratio 1, d/dlogp = -A.
    # rows of length 1 and 3, A = +1 both. d(aggregated)/dlogp:
    #   grpo: -1/(|o| * B) -> row 0: -1/2, row 1: -1/6 each (short responses weigh more per token)
    #   dapo: -1/4 on all 4 tokens
    #   dr_grpo (L_max 4): -1/(B * 4) = -1/8 on all tokens
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    expected = {
        "grpo": [[-1 / 2, 0, 0], [-1 / 6] * 3],
        "dapo": [[-1 / 4, 0, 0], [-1 / 4] * 3],
        "dr_grpo": [[-1 / 8, 0, 0], [-1 / 8] * 3],
    }
    for mode, grad in expected.items():
        logp = leaf([[-1.0, -5.0, -5.0], [-0.5, -2.0, -0.1]])
        per_tok, _ = ppo_clip_loss(logp, logp.detach(), t([1.0, 1.0]), mask)
        aggregate_loss(per_tok, mask, mode, max_completion_length=4).backward()  # type: ignore[arg-type]
        assert logp.grad is not None
        assert_close(logp.grad, t(grad), msg=mode)


def test_masked_mean_hand_values() -> None:
    x = t([[1.0, 3.0, math.nan], [2.0, 4.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert_close(masked_mean(x, m), t(2.0))  # (1 + 3) / 2
    assert_close(masked_mean(x, m, dim=-1), t([2.0, 0.0]))  # empty row -> 0


# ============================================================================ PPO / DAPO clip
def test_ppo_clip_higher_values_and_gradients() -> None:
    # epsilon 0.2, epsilon_high 0.28 (DAPO clip-higher); ratios set through log(ratio):
    # row 0, A = +1: ratio 1.5 -> -min(1.5, 1.28) = -1.28, clipped, grad 0
    #                ratio 1.25 -> inside [0.8, 1.28]: -1.25, grad -A * ratio = -1.25
    #                ratio 0.5 -> -min(0.5, 0.8) = -0.5 (pessimistic side, not clipped), grad -0.5
    # row 1, A = -1: ratio 0.5 -> -min(-0.5, -0.8) = 0.8, clipped, grad 0
    #                ratio 1.1 -> 1.1, grad +1.1
    #                ratio 1.5 -> -min(-1.5, -1.28) = 1.5 (not clipped), grad +1.5
    ratios = [[1.5, 1.25, 0.5], [0.5, 1.1, 1.5]]
    old = t([[-1.0, -2.0, -3.0], [-1.5, -0.5, -2.5]])
    logp = leaf((old + t(ratios).log()).tolist())
    adv = t([1.0, -1.0])
    mask = torch.ones(2, 3)
    loss, m = ppo_clip_loss(logp, old, adv, mask, epsilon=0.2, epsilon_high=0.28)
    assert_close(loss, t([[-1.28, -1.25, -0.5], [0.8, 1.1, 1.5]]))
    loss.sum().backward()
    assert logp.grad is not None
    assert_close(logp.grad, t([[0.0, -1.25, -0.5], [0.0, 1.1, 1.5]]))
    assert_close(m["clip_frac"], t(2 / 6))
    # approx_kl = mean(old - logp) = -mean(log ratios)
    assert_close(m["approx_kl"], -t(ratios).log().mean())


def test_symmetric_clip_clips_where_clip_higher_does_not() -> None:
    # ratio 1.25, A = +1: epsilon_high None -> upper 1.2: loss -1.2, grad 0
    old = t([[-1.0]])
    logp = leaf([[-1.0 + math.log(1.25)]])
    loss, m = ppo_clip_loss(logp, old, t([1.0]), torch.ones(1, 1), epsilon=0.2)
    assert_close(loss, t([[-1.2]]))
    loss.sum().backward()
    assert logp.grad is not None and logp.grad.item() == 0.0
    assert m["clip_frac"].item() == 1.0


def test_dual_clip_caps_negative_advantage_loss() -> None:
    # A = -2, ratio 4, c = 3: PPO loss -min(-8, -2 * 1.2) = 8; dual clip min(8, 3 * 2) = 6, grad 0
    # A = -2, ratio 2 (< c): loss 4, grad -A * ratio = 4
    # A = +1, ratio 4: dual clip does not apply: -min(4, 1.2) = -1.2
    old = t([[0.0, 0.0], [0.0, 0.0]])
    logp = leaf([[math.log(4.0), math.log(2.0)], [math.log(4.0), 0.0]])
    adv = t([[-2.0, -2.0], [1.0, 1.0]])  # per-token advantages
    loss, m = ppo_clip_loss(logp, old, adv, torch.ones(2, 2), dual_clip=3.0)
    assert_close(loss, t([[6.0, 4.0], [-1.2, -1.0]]))
    loss.sum().backward()
    assert logp.grad is not None
    assert_close(logp.grad, t([[0.0, 4.0], [0.0, -1.0]]))
    assert_close(m["dual_clip_frac"], t(0.25))


def test_ppo_masked_tokens_get_zero_loss_and_grad_even_with_extreme_logp() -> None:
    # masked positions hold very negative (finite) log-probs: no NaN, no gradient there
    old = t([[-1.0, -1e30]])
    logp = leaf([[-1.0, -1e9]])
    loss, m = ppo_clip_loss(logp, old, t([2.0]), torch.tensor([[1, 0]]))
    assert_close(loss, t([[-2.0, 0.0]]))
    loss.sum().backward()
    assert logp.grad is not None
    assert_close(logp.grad, t([[-2.0, 0.0]]))
    assert torch.isfinite(m["approx_kl"]) and m["approx_kl"].item() == 0.0


@pytest.mark.parametrize("bad", [-math.inf, math.nan])
@pytest.mark.parametrize("loss_fn", [ppo_clip_loss, gspo_loss, cispo_loss])
def test_nonfinite_values_at_masked_positions_reach_neither_loss_nor_gradient(loss_fn, bad: float) -> None:  # type: ignore[no-untyped-def]
    # aggregate_loss promises that masked positions may hold inf / NaN; the policy losses must keep
    # them out too: loss exactly 0 there, and no NaN in d/dlogp (old code: GSPO's
    # exp(logp - sg(logp) + s) is NaN at a -inf logp and its backward gave NaN).
    # Unmasked token: log ratio 0.2, A = 1: PPO/GSPO -min(e^0.2, 1.2) = -1.2 (clipped, grad 0);
    # CISPO -min(e^0.2, 1.2) * 1 * (-1) = 1.2, grad -1.2
    logp = leaf([[-1.0, bad]])
    old = t([[-1.2, bad]])
    mask = torch.tensor([[1, 0]])
    loss, metrics = loss_fn(logp, old, t([[1.0, bad]]), mask)
    expected = 1.2 if loss_fn is cispo_loss else -1.2
    assert_close(loss, t([[expected, 0.0]]))
    aggregate_loss(loss, mask, "dapo").backward()
    assert logp.grad is not None
    assert_close(logp.grad, t([[-1.2 if loss_fn is cispo_loss else 0.0, 0.0]]))
    assert all(bool(torch.isfinite(v)) for v in metrics.values())


def test_ppo_very_negative_logp_is_finite() -> None:
    # log ratio -45 is clamped to -20: ratio e^-20 = 2.06e-9; A = +1: loss -2.06e-9, no NaN
    logp = leaf([[-50.0]])
    loss, _ = ppo_clip_loss(logp, t([[-5.0]]), t([1.0]), torch.ones(1, 1))
    assert_close(loss, t([[-math.exp(-20.0)]]))
    loss.sum().backward()
    assert logp.grad is not None and torch.isfinite(logp.grad).all()


def test_zero_advantage_gives_zero_loss_and_grad() -> None:
    logp = leaf([[-1.0, -2.0]])
    loss, _ = ppo_clip_loss(logp, t([[-3.0, -0.1]]), t([0.0]), torch.ones(1, 2))
    loss.sum().backward()
    assert loss.abs().sum().item() == 0.0
    assert logp.grad is not None and logp.grad.abs().sum().item() == 0.0


# ============================================================================ GSPO
def test_gspo_sequence_ratio_values_and_gradients() -> None:
    # row 0: token log ratios 0.1, 0.3 -> s = 0.2, ratio e^0.2 = 1.2214027582 on both tokens, A = +1
    #   epsilon_high 0.28: inside, loss -1.2214 per token; GSPO gradient: d s / d logp_t = s / |o|
    #   -> with per-sequence token mean ("grpo"), d/dlogp_t = -A * s / (|o| * B) = -1.2214 / (2 * 2)
    # row 1: one token (log ratio -0.4, then padding with garbage), A = +1:
    #   ratio e^-0.4 = 0.6703200460 -> -min(0.6703, 0.8) = -0.6703 (not clipped), d/dlogp = -0.6703 / (1 * 2)
    old = t([[-1.0, -2.0], [-1.0, -3.0]])
    logp = leaf([[-0.9, -1.7], [-1.4, -1e9]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, m = gspo_loss(logp, old, t([1.0, 1.0]), mask, epsilon=0.2, epsilon_high=0.28)
    e2, e4 = math.exp(0.2), math.exp(-0.4)
    assert_close(loss, t([[-e2, -e2], [-e4, 0.0]]))
    aggregate_loss(loss, mask, "grpo").backward()
    assert logp.grad is not None
    assert_close(logp.grad, t([[-e2 / 4, -e2 / 4], [-e4 / 2, 0.0]]))
    assert m["clip_frac"].item() == 0.0


def test_gspo_clips_whole_sequence() -> None:
    # symmetric epsilon 0.2: s = 0.2 -> ratio 1.2214 > 1.2 and A > 0: every token clipped, loss -1.2, grad 0,
    # even though token 0's own ratio e^0.1 = 1.105 is inside the range
    old = t([[-1.0, -2.0]])
    logp = leaf([[-0.9, -1.7]])
    loss, m = gspo_loss(logp, old, t([1.0]), torch.ones(1, 2), epsilon=0.2)
    assert_close(loss, t([[-1.2, -1.2]]))
    loss.sum().backward()
    assert logp.grad is not None and logp.grad.abs().sum().item() == 0.0
    assert m["clip_frac"].item() == 1.0


def test_gspo_equals_sequence_level_objective_gradient() -> None:
    # GSPO's objective for one sequence: -A * s(theta), s = exp(mean_t(logp - old)); its gradient is
    # -A * s / |o| per token; the token form with "grpo" aggregation (B = 1) must match it
    old = t([[-1.0, -2.0, -0.5]])
    lp = [[-1.05, -1.9, -0.52]]
    logp = leaf(lp)
    loss, _ = gspo_loss(logp, old, t([-0.7]), torch.ones(1, 3), epsilon=10.0)
    aggregate_loss(loss, torch.ones(1, 3), "grpo").backward()
    ref = leaf(lp)
    (0.7 * torch.exp((ref - old).mean())).backward()
    assert logp.grad is not None and ref.grad is not None
    assert_close(logp.grad, ref.grad)


def test_gspo_zero_length_row() -> None:
    logp = leaf([[-1.0, -2.0]])
    loss, _ = gspo_loss(logp, t([[-5.0, -9.0]]), t([1.0]), torch.zeros(1, 2))
    assert loss.abs().sum().item() == 0.0
    aggregate_loss(loss, torch.zeros(1, 2), "grpo").backward()
    assert logp.grad is not None and logp.grad.abs().sum().item() == 0.0


# ============================================================================ CISPO
def test_cispo_values_and_gradients() -> None:
    # weights sg(min(ratio, 1 + 0.28)): ratio 1.5 -> 1.28, ratio 0.5 -> 0.5 (no lower clip); A = 2
    # loss = -w A logp: -1.28 * 2 * (-1) = 2.56, -0.5 * 2 * (-2) = 2.0; grad = -w A = -2.56, -1.0
    old = t([[-1.0 - math.log(1.5), -2.0 - math.log(0.5)]])
    logp = leaf([[-1.0, -2.0]])
    loss, m = cispo_loss(logp, old, t([2.0]), torch.ones(1, 2), epsilon_high=0.28)
    assert_close(loss, t([[2.56, 2.0]]))
    loss.sum().backward()
    assert logp.grad is not None
    assert_close(logp.grad, t([[-2.56, -1.0]]))
    assert_close(m["clip_frac"], t(0.5))


# ============================================================================ KL and entropy
def test_kl_estimators_values_and_gradients() -> None:
    # d = logp - ref: d = 1 and d = -1
    # k1 = d: 1, -1; grad 1
    # k2 = d^2 / 2: 0.5, 0.5; grad d: 1, -1
    # k3 = e^{-d} + d - 1: e^-1 = 0.3678794412, e - 2 = 0.7182818285; grad 1 - e^{-d}: 0.6321205588, 1 - e
    ref = t([[-2.0, -1.0]])
    cases = {
        "k1": ([1.0, -1.0], [1.0, 1.0]),
        "k2": ([0.5, 0.5], [1.0, -1.0]),
        "k3": ([math.exp(-1.0), math.e - 2.0], [1 - math.exp(-1.0), 1 - math.e]),
    }
    for est, (value, grad) in cases.items():
        logp = leaf([[-1.0, -2.0]])
        k = kl_penalty(logp, ref, est)  # type: ignore[arg-type]
        assert_close(k, t([value]), msg=est)
        k.sum().backward()
        assert logp.grad is not None
        assert_close(logp.grad, t([grad]), msg=est)


def test_k1_and_k3_are_unbiased_for_kl() -> None:
    # pi = [0.5, 0.3, 0.2], ref = [0.2, 0.3, 0.5]:
    # KL(pi || ref) = 0.5 ln 2.5 + 0 + 0.2 ln 0.4 = 0.4581453659 - 0.1832581464 = 0.2748872195
    pi, ref = t([[0.5, 0.3, 0.2]]), t([[0.2, 0.3, 0.5]])
    for est in ("k1", "k3"):
        assert_close((pi * kl_penalty(pi.log(), ref.log(), est)).sum(), t(0.2748872195), msg=est)  # type: ignore[arg-type]
    # k2 is biased: E[d^2 / 2] = 0.5 * (0.5 * 0.8395887 + 0.2 * 0.8395887) = 0.2938560
    assert_close((pi * kl_penalty(pi.log(), ref.log(), "k2")).sum(), t(0.5 * 0.7 * math.log(2.5) ** 2))


def test_k3_very_negative_logp_is_finite() -> None:
    # d = -50: x = clamp(50, -20, 20) = 20, value e^20 - 21; gradient 0 (clamped, as verl)
    logp = leaf([[-51.0]])
    k = kl_penalty(logp, t([[-1.0]]), "k3")
    assert_close(k, t([[math.exp(20.0) - 21.0]]))
    k.sum().backward()
    assert logp.grad is not None and logp.grad.item() == 0.0


def test_entropy_hand_values_and_gradient() -> None:
    # logits [ln 3, 0]: p = [0.75, 0.25]; H = -(0.75 ln 0.75 + 0.25 ln 0.25) = 0.5623351446
    # dH/dz_i = -p_i (ln p_i + H): -0.75 (-0.2876820725 + 0.5623351446) = -0.2059898041, +0.2059898041
    # logits [0, -inf, 0]: H = ln 2 = 0.6931471806 (the -inf token has no mass and no gradient)
    z = leaf([[[math.log(3.0), 0.0, -math.inf], [0.0, -math.inf, 0.0]]])
    h = entropy_from_logits(z, chunk_size=1)
    assert_close(h, t([[0.5623351446, math.log(2.0)]]))
    h[0, 0].backward()
    assert z.grad is not None
    assert_close(z.grad[0, 0], t([-0.2059898041, 0.2059898041, 0.0]))
    assert z.grad[0, 1].abs().sum().item() == 0.0


def test_entropy_bonus_sign_convention() -> None:
    # the trainer adds -entropy_coef * H to the per-token loss: descending it raises H.
    # With logits [ln 3, 0] a gradient step on -H moves the logits towards equal (H up).
    z = leaf([[[math.log(3.0), 0.0]]])
    (-entropy_from_logits(z)).sum().backward()
    assert z.grad is not None
    z2 = z.detach() - 0.1 * z.grad
    assert entropy_from_logits(z2).item() > entropy_from_logits(z.detach()).item()


# ============================================================================ off-policy corrections
# ref = logp.detach() = [-1, -1, -1]; behaviour [-2, -0.5, -1]: log ratios ref - behaviour = 1, -0.5, 0
LOGP = [[-1.0, -1.0, -1.0]]
BEHAV = [[-2.0, -0.5, -1.0]]


def test_tis_weights_and_gradient_through_ppo() -> None:
    # w = min(exp(log ratio), 2): e^1 = 2.718 -> 2; e^-0.5 = 0.6065306597; e^0 = 1; clip_frac 1/3
    # behaviour_kl = mean(behaviour - ref) = (-1 + 0.5 + 0) / 3 = -1/6
    logp = leaf(LOGP)
    c = tis_correction(logp, t(BEHAV), torch.ones(1, 3), cap=2.0)
    w = [2.0, math.exp(-0.5), 1.0]
    assert_close(c.weight, t([w]))
    assert_close(c.metrics["clip_frac"], t(1 / 3))
    assert_close(c.metrics["behaviour_kl"], t(-1 / 6))
    # on-policy PPO with A = 1 times the TIS weight, token mean: d/dlogp = -A w / 3
    per_tok, _ = ppo_clip_loss(logp, c.old_logp, t([1.0]), c.mask)
    aggregate_loss(per_tok * c.weight, c.mask, "dapo").backward()
    assert logp.grad is not None
    assert_close(logp.grad, t([[-x / 3 for x in w]]))


def test_decoupled_weight_uses_prox_and_ratio_uses_prox() -> None:
    # prox [-1.5, -1, -1]: weight exp(prox - behaviour) = e^0.5, e^-0.5, 1; old_logp = prox
    # PPO ratio pi/prox = e^0.5 = 1.6487 on token 0, A = 1 -> clipped at 1.2: grad 0
    prox = t([[-1.5, -1.0, -1.0]])
    logp = leaf(LOGP)
    c = decoupled_correction(logp, t(BEHAV), torch.ones(1, 3), prox_logp=prox)
    assert_close(c.weight, t([[math.exp(0.5), math.exp(-0.5), 1.0]]))
    assert_close(c.old_logp, prox)
    per_tok, _ = ppo_clip_loss(logp, c.old_logp, t([1.0]), c.mask)
    aggregate_loss(per_tok * c.weight, c.mask, "dapo").backward()
    assert logp.grad is not None
    assert_close(logp.grad, t([[0.0, -math.exp(-0.5) / 3, -1 / 3]]))


def test_icepop_band_masks_and_weights() -> None:
    # ratios e^1 (outside [0.5, 2]: masked), e^-0.5 = 0.6065 (kept, weight 0.6065), 1 (kept)
    c = icepop_correction(leaf(LOGP), t(BEHAV), torch.ones(1, 3))
    assert c.mask.tolist() == [[0.0, 1.0, 1.0]]
    assert_close(c.weight, t([[0.0, math.exp(-0.5), 1.0]]))
    assert_close(c.metrics["masked_frac"], t(1 / 3))


def test_m2po_hand_case() -> None:
    # M2 = log ratio^2 = [1, 0.25, 0.0001, 0]; sorted [0, 1e-4, 0.25, 1]; prefix means
    # 0, 5e-5, 0.0834, 0.3125 -> tau 0.04 keeps the two smallest (positions 3 and 2)
    logp = leaf([[-1.0, -1.0, -1.0, -1.0]])
    c = m2po_correction(logp, t([[-2.0, -0.5, -1.01, -1.0]]), torch.ones(1, 4), tau=0.04)
    assert c.mask.tolist() == [[0.0, 0.0, 1.0, 1.0]]
    assert_close(c.metrics["m2_after"], t(0.0001 / 2))


def test_mask_resumed_and_padding_with_nonfinite_behaviour() -> None:
    # token 1 resumed (masked out), token 2 padding with -inf behaviour log-prob: no NaN anywhere
    logp = leaf([[-1.0, -1.0, -3.0]])
    c = mask_resumed_correction(logp, t([[-1.5, -0.5, -math.inf]]), torch.tensor([[1, 1, 0]]),
                                resumed_mask=torch.tensor([[0, 1, 0]]))
    assert c.mask.tolist() == [[1.0, 0.0, 0.0]]
    for x in (c.weight, c.old_logp, *c.metrics.values()):
        assert torch.isfinite(x).all()
    assert_close(c.metrics["kept_frac"], t(0.5))
    assert_close(c.metrics["resumed_frac"], t(0.5))


# ============================================================================ speculative reuse
def test_speculative_output_is_exact_for_fresh_old_draws() -> None:
    # one-token responses over {a, b}; pi_old = [0.5, 0.5], pi_new = [0.8, 0.2], lenience 1.
    # P(out = a) = P(old = a) * 1 + P(old = b) * (1 - 0.2/0.5) * residual(a)
    #            = 0.5 + 0.5 * 0.6 * 1 = 0.8  (residual max(0, new - old) = [0.3, 0] -> [1, 0])
    p_old, p_new = t([0.5, 0.5]), t([0.8, 0.2])
    res = residual_distribution(p_new, p_old, 1.0)
    assert_close(res, t([1.0, 0.0]))
    acc = torch.minimum(torch.ones(2, dtype=F64), p_new / p_old)  # acceptance prob of each old token
    out_a = p_old[0] * acc[0] + (p_old * (1 - acc)).sum() * res[0]
    assert_close(out_a, t(0.8))


def test_speculative_reuse_of_outcome_selected_responses_biases_the_grpo_gradient() -> None:
    # The known concern, as an exact two-token case. When the old responses that come back were selected
    # by their rewards (the planner revisits a prompt because its last group was mixed; GRESO skips
    # all-correct / all-wrong prompts; staged sampling stopped at the first correct response), they are
    # not i.i.d. pi_old, while speculative acceptance only maps pi_old to pi_new.
    # Policy: one-token responses over {a (reward 1), b (reward 0)}, logits z, pi = softmax(z) = [0.2, 0.8],
    # pi_new = pi_old, groups of 2, GRPO group scaling with eps 0.
    # Fresh group: mixed with probability 2 * 0.2 * 0.8 = 0.32, then A = (+-0.5) / std, std = sqrt(0.5),
    #   A = +-1/sqrt(2), and sum_i A_i dlog pi(y_i)/dz = (1/sqrt(2)) (e_a - e_b); all-equal groups give 0.
    #   Expected gradient: 0.32 / sqrt(2) (e_a - e_b) = 0.2262741700 (e_a - e_b).
    # Reused group, given the prompt came back because its group was mixed: pi_new = pi_old accepts every
    #   token (threshold 1), so the group is the old {a, b} itself: gradient 1/sqrt(2) (e_a - e_b) every
    #   time, 1/0.32 = 3.125 times the on-policy expectation for this prompt.
    z = leaf([math.log(0.2), math.log(0.8)])

    def surrogate_grad(pair: list[int]) -> torch.Tensor:
        z.grad = None
        rewards = t([1.0 if y == 0 else 0.0 for y in pair])
        adv = grpo_advantages(rewards, torch.tensor([0, 0]), eps=0.0)
        (adv * torch.log_softmax(z, -1)[pair]).sum().backward()
        assert z.grad is not None
        return z.grad.clone()

    pi = [0.2, 0.8]
    fresh = sum(pi[y0] * pi[y1] * surrogate_grad([y0, y1]) for y0 in (0, 1) for y1 in (0, 1))
    assert_close(fresh, t([0.32 / math.sqrt(2), -0.32 / math.sqrt(2)]))
    old_logp = t([[math.log(0.2)], [math.log(0.8)]])  # the selected (mixed) old pair [a, b]
    n = speculative_accept_batch(old_logp.clone(), old_logp, 1.0, torch.rand(2, 1, dtype=F64))
    assert n.tolist() == [1, 1]  # both reused whole
    reused = surrogate_grad([0, 1])
    assert_close(reused, t([1 / math.sqrt(2), -1 / math.sqrt(2)]))
    assert_close(reused[0] / fresh[0], t(1 / 0.32))
