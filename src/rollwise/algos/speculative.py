"""Speculative reuse of earlier responses (SPEC-RL, Liu et al. 2025, arXiv:2509.23232).

A prompt seen in an earlier epoch comes back with its old response ``y`` (token ids and the
behaviour log-probs ``log pi_old(y_i)``). One forward pass of the current policy scores
``log pi_new(y_i)``; token ``i`` is accepted with probability ``min(1, l * pi_new / pi_old)``
(lenience ``l``), scanning left to right and stopping at the first rejection ``n``. The
prefix ``y[:n]`` is kept, position ``n`` is resampled from :func:`residual_distribution`
and generation continues from ``pi_new`` after it.

Exactness. For ``l <= 1`` and fresh i.i.d. uniforms this returns sequences distributed
exactly as ``pi_new`` (speculative sampling: Leviathan et al. 2023, arXiv:2211.17192; Chen et
al. 2023, arXiv:2302.01318). For ``l > 1`` no residual can be exact: the accepted mass on a
token is ``min(pi_old, l pi_new)``, which exceeds ``pi_new`` wherever ``pi_old > pi_new``;
the output leans towards ``pi_old`` in exchange for longer reuse (SPEC-RL's chosen
trade-off, ``l = e^0.5``). SPEC-RL itself resamples a rejected token from the full
``pi_new``, which is not exact even at ``l = 1``, and draws its uniforms from a fixed seed.

The caveat that matters in RL. Exactness assumes ``y`` is a draw from ``pi_old`` independent of
the new weights. In post-training the new weights were trained on ``y``: an update with positive
advantage raises ``y``'s own tokens (memorisation), so verification keeps it whole far more
often than a fresh sample of ``pi_new`` would reproduce anything like it, and a penalised ``y``
is cut short. bench/spec_memorization.py measures 0.81-0.84 against 0.34-0.48 after one update;
bench/RESULTS.md shows the accuracy it costs when prompts come back every few steps.

Usage, per batch of old responses (right-padded, ``mask`` 1 on response tokens)::

    n = speculative_accept_batch(new_logp, old_logp, lenience, torch.rand_like(new_logp), mask)
    # keep y[b, :n[b]]; if n[b] < len: sample y[b, n[b]] ~ residual_distribution(
    #     p_new[b, n[b]], p_old[b, n[b]], lenience), then continue generating from pi_new
"""

from __future__ import annotations

import math

import torch

Metrics = dict[str, torch.Tensor]


def _acceptance_prob(new_logp: torch.Tensor, old_logp: torch.Tensor, lenience: float) -> torch.Tensor:
    """``min(1, l * exp(new - old))`` in float64, 0 where ``pi_new = 0`` or the value is NaN."""
    if not lenience > 0:
        raise ValueError(f"lenience must be > 0, got {lenience}")
    delta = new_logp.detach().double() - old_logp.detach().double()  # same shape
    log_thr = delta + math.log(lenience)  # log(inf) = inf
    thr = torch.exp(log_thr.clamp(max=0.0))  # min(1, l r); exp(-inf) = 0, NaN stays NaN
    possible = torch.isfinite(delta) | (delta == math.inf)  # pi_new > 0 (and not NaN)
    return torch.where(possible & ~torch.isnan(thr), thr, torch.zeros_like(thr))


def speculative_accept_batch(
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    lenience: float,
    uniforms: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Accepted prefix lengths of a batch of old responses (SPEC-RL Eq. 4).

    Token ``i`` is accepted iff ``u_i <= min(1, l * exp(new_logp_i - old_logp_i))``; a token
    the new policy cannot produce (``new_logp = -inf``) is always rejected, even at
    ``u = 0``. Scanning stops at the first rejection.

    Args:
        new_logp (torch.Tensor): ``[B, L]`` current policy's log-probs of the old tokens.
        old_logp (torch.Tensor): ``[B, L]`` behaviour log-probs stored with the old response.
        lenience (float): ``l > 0``; 1 is exact speculative sampling, ``inf`` accepts all.
        uniforms (torch.Tensor): ``[B, L]`` i.i.d. U[0, 1) draws.
        mask (torch.Tensor | None): ``[B, L]`` bool or 0/1, 1 on response tokens; must be a
            prefix of each row (right padding). None: every position is a token.

    Returns:
        torch.Tensor: ``[B]`` long, the number of accepted tokens, which is also the index of
        the first rejection (equal to the row's length when all tokens are accepted).
    """
    if new_logp.dim() != 2:
        raise ValueError(f"new_logp must be [B, L], got shape {tuple(new_logp.shape)}")
    m = torch.ones_like(new_logp, dtype=torch.bool) if mask is None else mask != 0  # [B, L]
    for name, t in (("old_logp", old_logp), ("uniforms", uniforms), ("mask", m)):
        if t.shape != new_logp.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != new_logp shape {tuple(new_logp.shape)}")
    if (m[:, 1:] & ~m[:, :-1]).any():
        raise ValueError("mask must be a prefix of each row (right padding)")
    thr = _acceptance_prob(new_logp, old_logp, lenience)  # [B, L]
    accept = (uniforms.double() <= thr) & (thr > 0)  # [B, L]
    run = torch.cumprod((accept | ~m).long(), dim=-1)  # [B, L], 1 until the first rejection
    return (run * m.long()).sum(-1)  # [B]


def speculative_accept(
    new_logp: torch.Tensor, old_logp: torch.Tensor, lenience: float, uniforms: torch.Tensor
) -> int:
    """Accepted prefix length of one old response; see :func:`speculative_accept_batch`.

    Args:
        new_logp (torch.Tensor): ``[L]`` current policy's log-probs of the old tokens.
        old_logp (torch.Tensor): ``[L]`` behaviour log-probs stored with the old response.
        lenience (float): ``l > 0``.
        uniforms (torch.Tensor): ``[L]`` i.i.d. U[0, 1) draws.

    Returns:
        int: number of accepted tokens (index of the first rejection, or ``L``).
    """
    if new_logp.dim() != 1:
        raise ValueError(f"new_logp must be [L], got shape {tuple(new_logp.shape)}")
    return int(speculative_accept_batch(new_logp[None], old_logp[None], lenience, uniforms[None])[0])


def residual_distribution(p_new: torch.Tensor, p_old: torch.Tensor, lenience: float = 1.0) -> torch.Tensor:
    """Distribution to resample a rejected position from.

    ``normalize(max(0, p_new - min(p_old, l * p_new)))``, the part of ``p_new`` that the
    acceptance step did not already supply. At ``l = 1`` it is the standard residual
    ``normalize(max(0, p_new - p_old))`` and the output is exactly ``p_new``. For ``l < 1`` it
    is ``normalize(max(p_new - p_old, (1 - l) p_new))`` and still exact. For ``l > 1`` it
    equals the standard residual, which is the best available but not exact (see the
    module docstring). Where the residual has no mass (``p_new`` is covered entirely, e.g.
    ``p_new == p_old``) the result falls back to ``p_new``.

    Args:
        p_new (torch.Tensor): ``[V]`` (or ``[..., V]``) current policy's probabilities.
        p_old (torch.Tensor): same shape, behaviour policy's probabilities.
        lenience (float): ``l > 0``, the one used for acceptance.

    Returns:
        torch.Tensor: same shape and dtype as ``p_new``; each ``[V]`` row sums to 1.
    """
    if p_new.shape != p_old.shape:
        raise ValueError(f"p_old shape {tuple(p_old.shape)} != p_new shape {tuple(p_new.shape)}")
    if not lenience > 0:
        raise ValueError(f"lenience must be > 0, got {lenience}")
    p_old = p_old.to(p_new.dtype)
    scaled = torch.where(p_new > 0, p_new * lenience, torch.zeros_like(p_new))  # [..., V]; no inf*0
    resid = (p_new - torch.minimum(p_old, scaled)).clamp(min=0.0)  # [..., V]
    total = resid.sum(-1, keepdim=True)  # [..., 1]
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, resid / safe, p_new)


def old_distribution_from_topk(p_new: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor) -> torch.Tensor:
    """The old distribution over the vocabulary, from its stored top-k.

    Inside the top-k the stored probabilities are used. The remaining old mass ``1 - sum(top-k)``
    is spread over the other tokens in proportion to ``p_new`` (the tail is assumed to keep its
    shape). Treating the tail as 0 instead would make the residual at a rejection draw mostly
    from ``p_new``'s low-probability tail whenever the policies are close. Exact when the top-k
    holds all the old mass.

    Args:
        p_new (torch.Tensor): ``[V]`` current policy's probabilities.
        topk_ids (torch.Tensor): ``[K]`` token ids of the old top-k.
        topk_probs (torch.Tensor): ``[K]`` their old probabilities.

    Returns:
        torch.Tensor: ``[V]`` in ``p_new``'s dtype.
    """
    ids = topk_ids.long().to(p_new.device)  # a banked response keeps its top-k on the CPU
    p_old = torch.zeros_like(p_new).scatter(0, ids, topk_probs.to(p_new.device, p_new.dtype))
    outside = torch.ones_like(p_new, dtype=torch.bool).scatter(0, ids, False)
    old_tail = (1.0 - p_old.sum()).clamp(min=0.0)
    new_tail = p_new[outside].sum()
    if new_tail > 0:
        p_old = torch.where(outside, p_new * (old_tail / new_tail), p_old)
    return p_old


def reuse_metrics(accepted: torch.Tensor, lengths: torch.Tensor) -> Metrics:
    """Logging summary of one verification pass.

    Args:
        accepted (torch.Tensor): ``[B]`` accepted prefix lengths.
        lengths (torch.Tensor): ``[B]`` lengths of the old responses.

    Returns:
        dict: detached scalars ``tokens_reused`` (sum of ``accepted``), ``acceptance_rate``
        (reused / old tokens, 0 if there are none) and ``full_reuse_frac`` (share of
        responses accepted entirely, 0 for an empty batch).
    """
    acc, n = accepted.detach().double(), lengths.detach().double()
    total = n.sum()
    return {
        "tokens_reused": acc.sum(),
        "acceptance_rate": acc.sum() / torch.where(total > 0, total, torch.ones_like(total)),
        "full_reuse_frac": (acc >= n).double().mean() if acc.numel() else acc.new_zeros(()),
    }
