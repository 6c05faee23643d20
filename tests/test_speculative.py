"""Checks of rollwise.algos.speculative: hand-computed acceptance and residual cases (worked out in
the comments), and statistical tests of the whole accept / resample / continue procedure on a
toy 3-step autoregressive policy over a 4-token vocabulary."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run without install

from rollwise.algos import residual_distribution, reuse_metrics, speculative_accept, speculative_accept_batch

F64 = torch.float64


def t(*rows: object) -> torch.Tensor:
    return torch.tensor(rows if len(rows) > 1 else rows[0], dtype=F64)


# ----------------------------------------------------------------------------- acceptance

# pi_new / pi_old of the three old tokens: 0.5 / 0.25 = 2, 0.2 / 0.4 = 0.5, 0.9 / 0.9 = 1
NEW, OLD = t([0.5, 0.2, 0.9]).log(), t([0.25, 0.4, 0.9]).log()


@pytest.mark.parametrize(
    ("lenience", "uniforms", "expected"),
    [
        (1.0, [0.99, 0.40, 0.10], 3),  # thresholds [1, .5, 1]: .99 <= 1, .4 <= .5, .1 <= 1
        (1.0, [0.99, 0.60, 0.10], 1),  # .6 > .5: first rejection at index 1
        (1.0, [0.99, 0.60, 2e-9], 1),  # later tokens are not looked at after a rejection
        (2.0, [0.99, 0.60, 0.10], 3),  # thresholds [1, min(1, 2 * .5) = 1, 1]
        (0.5, [0.99, 0.20, 0.60], 2),  # thresholds [min(1, .5 * 2) = 1, .25, .5]: .6 > .5
        (0.5, [0.99, 0.30, 0.10], 1),  # .3 > .25
        (math.inf, [0.99, 0.99, 0.99], 3),  # infinite lenience reuses everything
    ],
)
def test_speculative_accept_hand_cases(lenience: float, uniforms: list[float], expected: int) -> None:
    assert speculative_accept(NEW, OLD, lenience, t(uniforms)) == expected


def test_token_impossible_under_new_policy_is_rejected_even_at_u_zero() -> None:
    new = t([-0.1, -math.inf, -0.1])
    assert speculative_accept(new, t([-0.1, -0.1, -0.1]), 1.0, t([0.0, 0.0, 0.0])) == 1
    assert speculative_accept(new, t([-0.1, -0.1, -0.1]), math.inf, t([0.0, 0.0, 0.0])) == 1


def test_accept_batch_with_right_padding() -> None:
    # row 0: the NEW/OLD row above with uniforms [.99, .4, .1] -> 3
    # row 1: 2 tokens, ratios [1, 0.5], uniforms [.5, .7] -> 1; the padded slot holds NaN
    # row 2: 1 token accepted, padding with a "rejecting" uniform -> 1 (padding never rejects)
    # row 3: empty response -> 0
    new = torch.stack([NEW, t([-1.0, math.log(0.5), math.nan]), t([0.0, -5.0, -5.0]), t([0.0, 0.0, 0.0])])
    old = torch.stack([OLD, t([-1.0, 0.0, 0.0]), t([0.0, 0.0, 0.0]), t([0.0, 0.0, 0.0])])
    u = t([0.99, 0.4, 0.1], [0.5, 0.7, 0.0], [0.3, 0.99, 0.99], [0.0, 0.0, 0.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [0, 0, 0]])
    out = speculative_accept_batch(new, old, 1.0, u, mask)
    assert out.tolist() == [3, 1, 1, 0]
    assert out.dtype == torch.long


def test_accept_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="prefix"):
        speculative_accept_batch(NEW[None], OLD[None], 1.0, t([[0.1, 0.1, 0.1]]), torch.tensor([[1, 0, 1]]))
    with pytest.raises(ValueError, match="lenience"):
        speculative_accept(NEW, OLD, 0.0, t([0.1, 0.1, 0.1]))
    with pytest.raises(ValueError, match="uniforms shape"):
        speculative_accept(NEW, OLD, 1.0, t([0.1, 0.1]))


def test_reuse_metrics() -> None:
    # accepted [3, 1, 0] of lengths [3, 2, 5]: 4 reused of 10 old tokens, 1 of 3 fully reused
    m = reuse_metrics(torch.tensor([3, 1, 0]), torch.tensor([3, 2, 5]))
    assert_close(m["tokens_reused"], t(4.0))
    assert_close(m["acceptance_rate"], t(0.4))
    assert_close(m["full_reuse_frac"], t(1 / 3))
    empty = reuse_metrics(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    assert all(torch.isfinite(v) and v == 0 for v in empty.values())


# ----------------------------------------------------------------------------- residual

P_NEW, P_OLD = t([0.5, 0.3, 0.2, 0.0]), t([0.25, 0.25, 0.25, 0.25])


def _output_distribution(p_new: torch.Tensor, p_old: torch.Tensor, lenience: float) -> torch.Tensor:
    """Exact one-step output: accepted mass p_old * min(1, l p_new / p_old) plus rejection * residual."""
    accepted = p_old * (lenience * p_new / p_old).clamp(max=1.0)
    return accepted + (1.0 - accepted.sum()) * residual_distribution(p_new, p_old, lenience)


def test_residual_at_lenience_one_is_standard_and_exact() -> None:
    # min(p_old, p_new) = [.25, .25, .2, 0], rejection mass .3; max(0, p_new - p_old) = [.25, .05, 0, 0]
    # -> residual [5/6, 1/6, 0, 0]; output [.25 + .3 * 5/6, .25 + .3 / 6, .2, 0] = p_new
    assert_close(residual_distribution(P_NEW, P_OLD), t([5 / 6, 1 / 6, 0.0, 0.0]))
    assert_close(_output_distribution(P_NEW, P_OLD, 1.0), P_NEW)


def test_residual_below_one_is_exact() -> None:
    # p_new = [.7, .1, .2, 0], l = .5: l p_new = [.35, .05, .1, 0], min with p_old = [.25, .05, .1, 0]
    # (sum .4); residual p_new - that = [.45, .05, .1, 0] / .6 = [.75, 1/12, 1/6, 0]
    # output [.25 + .45, .05 + .05, .1 + .1, 0] = p_new
    p_new = t([0.7, 0.1, 0.2, 0.0])
    assert_close(residual_distribution(p_new, P_OLD, 0.5), t([0.75, 1 / 12, 1 / 6, 0.0]))
    assert_close(_output_distribution(p_new, P_OLD, 0.5), p_new)


def test_residual_above_one_is_not_exact() -> None:
    # l = 2: l p_new = [1.4, .2, .4, 0], accepted min = [.25, .2, .25, 0] (sum .7), already
    # .25 > .2 on token 2; residual max(0, [.45, -.1, -.05, 0]) -> [1, 0, 0, 0]
    # output [.25 + .3, .2, .25, 0] = [.55, .2, .25, 0] != p_new
    p_new = t([0.7, 0.1, 0.2, 0.0])
    assert_close(residual_distribution(p_new, P_OLD, 2.0), t([1.0, 0.0, 0.0, 0.0]))
    assert_close(_output_distribution(p_new, P_OLD, 2.0), t([0.55, 0.2, 0.25, 0.0]))


def test_residual_degenerate_falls_back_to_p_new_per_row() -> None:
    # row 0: p_new == p_old -> no residual mass -> p_new; row 1: the standard case above
    p_new = torch.stack([P_OLD, P_NEW])
    out = residual_distribution(p_new, torch.stack([P_OLD, P_OLD]))
    assert_close(out, torch.stack([P_OLD, t([5 / 6, 1 / 6, 0.0, 0.0])]))
    assert torch.isfinite(residual_distribution(t([0.0, 1.0]), t([0.5, 0.5]), math.inf)).all()


# ----------------------------------------------------------------------------- statistics

V, T, N = 4, 3, 200_000


def _toy_policies() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Explicit tables p(y1) [V], p(y2 | y1) [V, V], p(y3 | y1, y2) [V, V, V] for pi_old and pi_new."""
    g = torch.Generator().manual_seed(0)
    old = [torch.randn((V,) * (k + 1), generator=g, dtype=F64) for k in range(T)]
    new = [x + torch.randn(x.shape, generator=g, dtype=F64) for x in old]
    return [x.softmax(-1) for x in old], [x.softmax(-1) for x in new]


def _cond(tables: list[torch.Tensor], step: int, prefix: torch.Tensor) -> torch.Tensor:
    """``[N, V]`` next-token distributions given ``prefix [N, step]``."""
    return tables[step][tuple(prefix.T)] if step else tables[0].expand(prefix.shape[0], V)


def _draw(p: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    u = torch.rand(p.shape[0], 1, generator=g, dtype=F64)
    return (u > p.cumsum(-1)).sum(-1).clamp(max=V - 1)  # inverse CDF, [N]


def _joint(tables: list[torch.Tensor]) -> torch.Tensor:
    """``[V^3]`` sequence probabilities, index y1 * 16 + y2 * 4 + y3."""
    return (tables[0][:, None, None] * tables[1][:, :, None] * tables[2]).reshape(-1)


def _speculative_rollouts(lenience: float, residual: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw N old responses from pi_old, verify them under pi_new, resample the first rejected
    position (from the residual, or from the full pi_new as SPEC-RL does) and continue from
    pi_new. Returns the sequence codes of the old and of the final responses, each ``[N]``."""
    old_t, new_t = _toy_policies()
    g = torch.Generator().manual_seed(1)
    y = torch.zeros(N, T, dtype=torch.long)
    old_lp, new_lp = torch.zeros(N, T, dtype=F64), torch.zeros(N, T, dtype=F64)
    for s in range(T):
        p_old = _cond(old_t, s, y[:, :s])  # [N, V]
        y[:, s] = _draw(p_old, g)
        old_lp[:, s] = p_old.gather(1, y[:, s : s + 1]).squeeze(1).log()
        new_lp[:, s] = _cond(new_t, s, y[:, :s]).gather(1, y[:, s : s + 1]).squeeze(1).log()
    accepted = speculative_accept_batch(new_lp, old_lp, lenience, torch.rand(N, T, generator=g, dtype=F64))
    assert all(int((accepted == k).sum()) > N // 20 for k in range(T + 1))  # every branch is exercised
    out = y.clone()
    for s in range(T):
        p_new, p_old = _cond(new_t, s, out[:, :s]), _cond(old_t, s, out[:, :s])  # [N, V]
        at_rejection = residual_distribution(p_new, p_old, lenience) if residual else p_new
        fresh = _draw(torch.where((accepted == s)[:, None], at_rejection, p_new), g)  # [N]
        out[:, s] = torch.where(accepted > s, y[:, s], fresh)
    code = torch.tensor([16, 4, 1])
    return (y * code).sum(-1), (out * code).sum(-1)


def _compare(codes: torch.Tensor, p: torch.Tensor) -> tuple[float, float]:
    """(total-variation distance, chi-square p-value with V^3 - 1 dof) of codes against p."""
    counts = torch.bincount(codes, minlength=V**T).to(F64)
    expected = N * p  # every cell > 11 here
    chi2 = ((counts - expected) ** 2 / expected).sum()
    p_value = torch.special.gammaincc(torch.tensor((V**T - 1) / 2, dtype=F64), chi2 / 2)
    return 0.5 * float((counts / N - p).abs().sum()), float(p_value)


# Sampling noise: E[TV] between N = 200k draws and the truth is about
# 0.5 * sum_x sqrt(2 p_x / (pi N)) <= 0.5 * 8 * sqrt(2 / (pi * 200000)) ~ 0.007 for 64 cells.
NOISE_TV = 0.01


@pytest.mark.parametrize("lenience", [1.0, 0.5])
def test_accept_and_residual_resample_reproduce_new_policy(lenience: float) -> None:
    old_t, new_t = _toy_policies()
    old_codes, codes = _speculative_rollouts(lenience, residual=True)
    tv_old, p_old_fit = _compare(old_codes, _joint(old_t))
    assert tv_old < NOISE_TV and p_old_fit > 1e-3  # the harness samples pi_old correctly
    assert 0.5 * float((_joint(old_t) - _joint(new_t)).abs().sum()) > 0.3  # the policies differ a lot
    tv, p_value = _compare(codes, _joint(new_t))
    assert tv < NOISE_TV
    assert p_value > 1e-3


def test_spec_rl_full_resample_shortcut_is_biased() -> None:
    # Same draws, but the rejected position is resampled from the full pi_new: the tokens that
    # acceptance already over-supplies get sampled again, so the output is not pi_new (TV ~ 0.13).
    _, new_t = _toy_policies()
    _, codes = _speculative_rollouts(1.0, residual=False)
    tv, p_value = _compare(codes, _joint(new_t))
    assert tv > 5 * NOISE_TV
    assert p_value < 1e-12


def test_old_distribution_from_topk_spreads_the_tail_like_p_new() -> None:
    from rollwise.algos.speculative import old_distribution_from_topk

    p_new = t([0.5, 0.2, 0.2, 0.1])
    # old top-2: token 0 at 0.6, token 3 at 0.2; old tail mass 0.2 over tokens 1, 2 (p_new 0.2 each -> 0.1 each)
    p_old = old_distribution_from_topk(p_new, torch.tensor([0, 3]), t([0.6, 0.2]))
    assert_close(p_old, t([0.6, 0.1, 0.1, 0.2]))
    full = old_distribution_from_topk(p_new, torch.tensor([0, 1, 2, 3]), t([0.4, 0.3, 0.2, 0.1]))
    assert_close(full, t([0.4, 0.3, 0.2, 0.1]))  # the whole vocabulary stored: exactly the old distribution
    same = old_distribution_from_topk(p_new, torch.tensor([0]), t([0.5]))
    assert_close(same, p_new)  # the policies agree: the residual has no mass, nothing is drawn from the tail
    assert_close(residual_distribution(p_new, same), p_new)  # (falls back to p_new only because it is empty)
