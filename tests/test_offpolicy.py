"""Hand-computed checks of rollwise.algos.offpolicy: every expected value below is worked out
in the comments next to it, not produced by the code under test."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run without install

from rollwise.algos import (
    OFFPOLICY_CORRECTIONS,
    Correction,
    aggregate_loss,
    decoupled_correction,
    get_offpolicy_correction,
    icepop_correction,
    m2po_correction,
    mask_resumed_correction,
    ppo_clip_loss,
    recompute_correction,
    tis_correction,
)

F64 = torch.float64
E, INV_E = math.e, math.exp(-1.0)  # 2.718281828459045, 0.36787944117144233


def t(*rows: object) -> torch.Tensor:
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=F64)


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """logp (grad), behaviour, mask, resumed. With ref = logp the log-ratios ref - behaviour are
    [[0, 1, -1], [0, -1, (masked)]], ratios [[1, e, 1/e], [1, 1/e, -]]; 5 tokens, 2 resumed."""
    logp = t([-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]).requires_grad_()
    behaviour = t([-1.0, -1.5, -1.0], [-0.3, -0.2, -math.inf])  # -inf at the padded slot
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    resumed = torch.tensor([[1, 1, 0], [0, 0, 0]])
    return logp, behaviour, mask, resumed


def test_registry_names_and_unknown_name() -> None:
    assert set(OFFPOLICY_CORRECTIONS) == {"recompute", "mask_resumed", "tis", "decoupled", "m2po", "icepop"}
    assert get_offpolicy_correction("tis") is tis_correction
    with pytest.raises(ValueError, match="allowed: decoupled, icepop, m2po, mask_resumed, recompute, tis"):
        get_offpolicy_correction("nope")


def test_recompute() -> None:
    logp, behaviour, mask, resumed = batch()
    c = recompute_correction(logp, behaviour, mask, resumed)
    assert isinstance(c, Correction)
    assert_close(c.old_logp, logp.detach())  # prox None -> current policy, detached
    assert_close(c.weight, t([1.0, 1.0, 1.0], [1.0, 1.0, 0.0]))
    assert_close(c.mask, t([1.0, 1.0, 1.0], [1.0, 1.0, 0.0]))
    assert_close(c.metrics["kept_frac"], t(1.0))
    # behaviour_kl = mean of -(log-ratio) over 5 tokens = (0 - 1 + 1 + 0 + 1) / 5 = 0.2
    assert_close(c.metrics["behaviour_kl"], t(0.2))
    assert_close(c.metrics["resumed_frac"], t(0.4))  # 2 of 5


def test_recompute_uses_prox_when_given() -> None:
    logp, behaviour, mask, _ = batch()
    prox = t([-1.1, -0.6, -1.9], [-0.4, -1.0, -0.8])
    c = recompute_correction(logp, behaviour, mask, prox_logp=prox)
    # prox on tokens; the padded slot (1, 2) holds logp's -0.7, so the PPO ratio is 1 there
    assert_close(c.old_logp, t([-1.1, -0.6, -1.9], [-0.4, -1.0, -0.7]))


def test_mask_resumed() -> None:
    logp, behaviour, mask, resumed = batch()
    c = mask_resumed_correction(logp, behaviour, mask, resumed)
    # mask * (1 - resumed) = [[0, 0, 1], [1, 1, 0]], 3 of 5 kept
    assert_close(c.mask, t([0.0, 0.0, 1.0], [1.0, 1.0, 0.0]))
    assert_close(c.weight, c.mask)
    assert_close(c.metrics["kept_frac"], t(0.6))
    with pytest.raises(ValueError, match="resumed_mask"):
        mask_resumed_correction(logp, behaviour, mask)


def test_tis_cap_two() -> None:
    logp, behaviour, mask, resumed = batch()
    c = tis_correction(logp, behaviour, mask, resumed)  # cap 2
    # ratios [[1, e, 1/e], [1, 1/e, -]] -> min(., 2) = [[1, 2, 1/e], [1, 1/e, 0]]
    assert_close(c.weight, t([1.0, 2.0, INV_E], [1.0, INV_E, 0.0]))
    assert_close(c.old_logp, logp.detach())
    assert_close(c.mask, mask.to(F64))
    assert_close(c.metrics["clip_frac"], t(0.2))  # only e > 2
    assert_close(c.metrics["weight_mean"], t((4.0 + 2 * INV_E) / 5))  # (1 + 2 + 1/e + 1 + 1/e) / 5
    c3 = tis_correction(logp, behaviour, mask, cap=3.0)
    assert_close(c3.weight[0, 1], t(E))  # e < 3: not capped


def test_decoupled_uses_prox_for_ratio_and_behaviour_weight() -> None:
    logp, behaviour, mask, resumed = batch()
    prox = t([-1.0, -1.0, -1.5], [-0.5, -0.2, -9.0])
    # prox - behaviour = [[0, 0.5, -0.5], [-0.2, 0, masked]]
    c = decoupled_correction(logp, behaviour, mask, resumed, prox_logp=prox)
    w = t([1.0, math.exp(0.5), math.exp(-0.5)], [math.exp(-0.2), 1.0, 0.0])  # 1.6487.., 0.6065.., 0.8187..
    assert_close(c.weight, w)
    # old_logp = prox on tokens; the padded slot holds logp's -0.7 (ratio 1 there)
    assert_close(c.old_logp, t([-1.0, -1.0, -1.5], [-0.5, -0.2, -0.7]))
    assert_close(c.metrics["clip_frac"], t(0.0))
    capped = decoupled_correction(logp, behaviour, mask, prox_logp=prox, cap=1.5)
    assert_close(capped.weight[0, 1], t(1.5))  # 1.6487 > 1.5
    assert_close(capped.metrics["clip_frac"], t(0.2))


def test_decoupled_gradient_through_ppo_loss() -> None:
    # At logp = prox the PPO ratio is 1 and unclipped, so d(-w * r * A)/d logp = -w * A per token;
    # with "dapo" aggregation over the 5 kept tokens the gradient is -w * A / 5.
    logp, behaviour, mask, _ = batch()
    adv = t([2.0, -1.0])
    c = decoupled_correction(logp, behaviour, mask, prox_logp=logp.detach(), advantages=adv)
    loss_tok, _ = ppo_clip_loss(logp, c.old_logp, adv, c.mask)
    aggregate_loss(loss_tok * c.weight, c.mask, "dapo").backward()
    # w = [[1, e, 1/e], [1, 1/e, 0]], A = [2, -1]
    expected = t([-2.0, -2.0 * E, -2.0 * INV_E], [1.0, INV_E, 0.0]) / 5
    assert_close(logp.grad, expected)


def test_m2po_masks_largest_until_second_moment_below_tau() -> None:
    # log-ratios d = [0.1, -0.1, 0.3, 0.5, 0.0] (row 0) and a masked 5.0 (row 1, ignored)
    # M2 = [.01, .01, .09, .25, 0]; sorted [0, .01, .01, .09, .25], prefix means
    # [0, .005, .00667, .0275, .072]: the largest prefix with mean <= .04 has 4 tokens,
    # so only the .25 token (index 3) is masked. m2_before = .36 / 5, m2_after = .11 / 4.
    logp = torch.zeros(2, 5, dtype=F64, requires_grad=True)
    behaviour = -t([0.1, -0.1, 0.3, 0.5, 0.0], [5.0, 0.0, 0.0, 0.0, 0.0])
    mask = t([1.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0])
    c = m2po_correction(logp, behaviour, mask)
    assert_close(c.mask, t([1.0, 1.0, 1.0, 0.0, 1.0], [0.0] * 5))
    assert_close(c.weight, c.mask)
    assert_close(c.metrics["masked_frac"], t(0.2))
    assert_close(c.metrics["m2_before"], t(0.072))
    assert_close(c.metrics["m2_after"], t(0.0275))
    # tau = 0.006: prefix means [0, .005] qualify, .00667 does not; keep d = 0 and the first
    # of the tied .01 values (stable sort: index 0 before index 1)
    c2 = m2po_correction(logp, behaviour, mask, tau=0.006)
    assert_close(c2.mask[0], t([1.0, 0.0, 0.0, 0.0, 1.0]))


def test_m2po_keeps_one_token_when_none_qualify() -> None:
    # M2 = [.25, .09, 1.0], all > .04: keep only the smallest (index 1)
    logp = torch.zeros(1, 3, dtype=F64)
    c = m2po_correction(logp, -t([[0.5, -0.3, 1.0]]), torch.ones(1, 3))
    assert_close(c.mask, t([[0.0, 1.0, 0.0]]))
    assert_close(c.metrics["m2_after"], t(0.09))


def test_icepop_band() -> None:
    # log-ratios [0, 1, -1, ln 1.5, -0.6] -> ratios [1, e, 1/e, 1.5, 0.5488]; band [0.5, 2]
    # keeps 1, 1.5 and 0.5488 (e > 2, 1/e < 0.5 are masked); weight M(k) = k inside the band
    logp = torch.zeros(1, 5, dtype=F64, requires_grad=True)
    behaviour = -t([[0.0, 1.0, -1.0, math.log(1.5), -0.6]])
    c = icepop_correction(logp, behaviour, torch.ones(1, 5))
    assert_close(c.mask, t([[1.0, 0.0, 0.0, 1.0, 1.0]]))
    assert_close(c.weight, t([[1.0, 0.0, 0.0, 1.5, math.exp(-0.6)]]))
    assert_close(c.metrics["masked_frac"], t(0.4))
    plain = icepop_correction(logp, behaviour, torch.ones(1, 5), weighted=False, low=0.3, high=3.0)
    assert_close(plain.weight, t([[1.0, 1.0, 1.0, 1.0, 1.0]]))  # every ratio in [0.3, 3]


@pytest.mark.parametrize("name", sorted(OFFPOLICY_CORRECTIONS))
def test_empty_mask_gives_zeros_not_nan(name: str) -> None:
    logp = torch.zeros(2, 3, dtype=F64, requires_grad=True)
    behaviour = torch.full((2, 3), -math.inf, dtype=F64)  # garbage everywhere, all masked
    zeros = torch.zeros(2, 3, dtype=F64)
    c = get_offpolicy_correction(name)(logp, behaviour, zeros, resumed_mask=zeros)
    assert_close(c.mask, zeros)
    assert_close(c.weight, zeros)
    assert torch.isfinite(c.old_logp).all()
    for key, value in c.metrics.items():
        assert torch.isfinite(value), key
        assert value.dim() == 0


@pytest.mark.parametrize("name", sorted(OFFPOLICY_CORRECTIONS))
def test_outputs_carry_no_gradient(name: str) -> None:
    logp, behaviour, mask, resumed = batch()
    prox = (logp + 0.1).detach()
    c = get_offpolicy_correction(name)(logp, behaviour, mask, resumed, prox, t([1.0, -1.0]))
    assert not c.weight.requires_grad
    assert not c.old_logp.requires_grad
    assert not c.mask.requires_grad
    assert all(not v.requires_grad for v in c.metrics.values())
    assert torch.isfinite(c.weight).all() and torch.isfinite(c.old_logp).all()
    assert c.mask.dtype == F64


def test_shape_mismatch_raises() -> None:
    logp, behaviour, mask, _ = batch()
    with pytest.raises(ValueError, match="behaviour_logp shape"):
        tis_correction(logp, behaviour[:, :2], mask)
    with pytest.raises(ValueError, match="must be"):
        tis_correction(logp[0], behaviour[0], mask[0])
    with pytest.raises(ValueError, match="cap"):
        tis_correction(logp, behaviour, mask, cap=0.0)
