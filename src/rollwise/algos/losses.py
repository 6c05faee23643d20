"""Per-token policy-gradient losses, a KL penalty and a token entropy.

Each policy loss returns ``(loss [B, L], metrics)``: the per-token loss, exactly 0 at
masked positions, to be reduced with :func:`rollwise.algos.aggregation.aggregate_loss`,
and a dict of detached scalar tensors for logging. ``old_logp`` and ``advantages`` are
treated as constants (detached inside), so passing ``old_logp=logp`` gives the on-policy
gradient. Masked positions may hold any values, even ``-inf`` or NaN. All three losses share the
signature ``(logp, old_logp, advantages, mask, epsilon, epsilon_high)`` so that the
trainer can pick one from :data:`POLICY_LOSSES` by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from rollwise.algos.aggregation import masked_mean

Metrics = dict[str, torch.Tensor]
KLEstimator = Literal["k1", "k2", "k3"]


def _prepare(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
    epsilon_high: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """Validate; return ``(logp, old_logp, adv, mask, eps_high)``, all ``[B, L]`` (mask as float).

    At masked positions ``logp`` and ``old_logp`` are replaced by 0 and ``adv`` by 0 with
    ``torch.where``: whatever they held there (``-inf``, NaN) then reaches neither the loss
    value nor the gradient (``0 * NaN`` in a backward pass would otherwise reach ``logp``).
    """
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, L], got shape {tuple(logp.shape)}")
    for name, t in (("old_logp", old_logp), ("mask", mask)):
        if t.shape != logp.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logp shape {tuple(logp.shape)}")
    if advantages.shape == logp.shape[:1]:
        adv = advantages.detach().unsqueeze(-1)  # [B, 1]
    elif advantages.shape == logp.shape:
        adv = advantages.detach()  # [B, L]
    else:
        raise ValueError(
            f"advantages must be [B] or [B, L] with B, L = {tuple(logp.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    eps_high = epsilon if epsilon_high is None else epsilon_high
    if epsilon < 0 or eps_high < 0:
        raise ValueError(f"epsilon and epsilon_high must be >= 0, got {epsilon}, {eps_high}")
    m = mask.to(logp.dtype)  # [B, L]
    keep = m != 0  # [B, L]
    zeros = torch.zeros_like(logp)  # [B, L]
    logp = torch.where(keep, logp, zeros)  # [B, L]; gradient 0 at masked positions
    old = torch.where(keep, old_logp.detach().to(logp.dtype), zeros)  # [B, L]
    adv = torch.where(keep, adv.to(logp.dtype).expand_as(logp), zeros)  # [B, L]
    return logp, old, adv, m, eps_high


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, epsilon: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(-min(ratio A, clip(ratio) A) [B, L], bool [B, L] where the clip is active)``."""
    unclipped = -adv * ratio  # [B, L]
    clipped = -adv * ratio.clamp(1.0 - epsilon, 1.0 + eps_high)  # [B, L]
    is_clipped = ((ratio < 1.0 - epsilon) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
    return torch.maximum(unclipped, clipped), is_clipped


def _metrics(
    is_clipped: torch.Tensor, ratio: torch.Tensor, log_ratio: torch.Tensor, m: torch.Tensor
) -> Metrics:
    """Detached ``clip_frac``, ``ratio_mean`` and ``approx_kl`` (masked mean of -log_ratio)."""
    with torch.no_grad():
        return {
            "clip_frac": masked_mean(is_clipped.to(m.dtype), m),
            "ratio_mean": masked_mean(ratio.detach(), m),
            "approx_kl": masked_mean(-log_ratio.detach(), m),
        }


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), as used by GRPO/DAPO.

    ``ratio = exp(clamp(logp - old_logp, -20, 20))`` and
    ``loss = -min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon_high) A)``. With
    ``dual_clip = c`` (Ye et al. 2020, *Mastering Complex Control in MOBA Games*,
    arXiv:1912.09729), tokens with ``A < 0`` get ``loss = min(loss, -c A)``, bounding the
    loss when the ratio explodes.

    Args:
        logp (torch.Tensor): ``[B, L]`` trained policy's log-probs of the sampled tokens.
        old_logp (torch.Tensor): ``[B, L]`` behaviour/proximal log-probs (constant).
        advantages (torch.Tensor): ``[B]`` per sequence or ``[B, L]`` per token (constant).
        mask (torch.Tensor): ``[B, L]`` bool or 0/1 float; 1 marks trained tokens.
        epsilon (float): lower clip bound ``1 - epsilon``.
        epsilon_high (float | None): upper bound ``1 + epsilon_high``; None: ``epsilon``.
        dual_clip (float | None): ``c > 1``, or ``None`` to disable the dual clip.

    Returns:
        tuple: ``loss [B, L]`` and metrics ``clip_frac`` (share of masked tokens where the
        PPO clip is active), ``ratio_mean``, ``approx_kl`` (masked mean of
        ``old_logp - logp``), ``dual_clip_frac`` (share where the dual clip is active).
    """
    logp, old_logp, adv, m, eps_high = _prepare(logp, old_logp, advantages, mask, epsilon, epsilon_high)
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # [B, L]
    ratio = torch.exp(log_ratio)  # [B, L]
    loss, is_clipped = _clipped_surrogate(ratio, adv, epsilon, eps_high)  # [B, L], [B, L]
    is_dual = torch.zeros_like(is_clipped)  # [B, L]
    if dual_clip is not None:
        cap = -adv * dual_clip  # [B, L]; positive where A < 0
        is_dual = (adv < 0) & (loss > cap)  # [B, L]
        loss = torch.where(adv < 0, torch.minimum(loss, cap), loss)  # [B, L]
    metrics = _metrics(is_clipped, ratio, logp - old_logp, m)
    metrics["dual_clip_frac"] = masked_mean(is_dual.to(m.dtype), m)
    return loss * m, metrics


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO, sequence-level importance ratio (Zheng et al. 2025, arXiv:2507.18071).

    ``s_b = masked mean_t (logp - old_logp)`` and the per-token ratio is
    ``exp(logp - sg(logp) + sg(s_b))``: its value is the sequence ratio ``exp(s_b)`` on every
    token, while the gradient reaches each token's ``logp`` (``d ratio / d logp = ratio``).
    It is clipped like PPO. The paper's objective is recovered with
    ``aggregate_loss(..., "grpo")``; note that the paper uses far smaller clip ranges
    (``epsilon=3e-4``, ``epsilon_high=4e-4``) than the 0.2 default here. ``s_b`` is
    clamped to ``[-20, 20]``; rows without tokens get ``s_b = 0`` and a loss of 0.

    Args:
        logp (torch.Tensor): ``[B, L]`` trained policy's log-probs of the sampled tokens.
        old_logp (torch.Tensor): ``[B, L]`` behaviour/proximal log-probs (constant).
        advantages (torch.Tensor): ``[B]`` per sequence or ``[B, L]`` per token (constant).
        mask (torch.Tensor): ``[B, L]`` bool or 0/1 float; 1 marks trained tokens.
        epsilon (float): lower clip bound ``1 - epsilon``.
        epsilon_high (float | None): upper bound ``1 + epsilon_high``; None: ``epsilon``.

    Returns:
        tuple: ``loss [B, L]`` and metrics ``clip_frac`` (share of masked tokens in clipped
        sequences), ``ratio_mean`` (token-weighted mean sequence ratio), ``approx_kl``.
    """
    logp, old_logp, adv, m, eps_high = _prepare(logp, old_logp, advantages, mask, epsilon, epsilon_high)
    seq_log_ratio = masked_mean((logp - old_logp).detach(), m, dim=-1)  # [B]
    seq_log_ratio = seq_log_ratio.clamp(-20.0, 20.0).unsqueeze(-1)  # [B, 1]
    ratio = torch.exp(logp - logp.detach() + seq_log_ratio)  # [B, L], value exp(s_b)
    loss, is_clipped = _clipped_surrogate(ratio, adv, epsilon, eps_high)  # [B, L], [B, L]
    return loss * m, _metrics(is_clipped, ratio, logp - old_logp, m)


def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax 2025, *MiniMax-M1*, arXiv:2506.13585).

    ``loss = -sg(min(ratio, 1 + epsilon_high)) * A * logp``: the importance weight is
    clipped and detached, so no token is dropped from the gradient (unlike PPO's clip).
    Only the upper side is clipped, as in TRL (verl also clips below); ``epsilon`` is unused,
    kept for a uniform signature. TRL's ``epsilon_high`` is the cap itself; here the cap is
    ``1 + epsilon_high`` (pass 4 for TRL's 5). Only the gradient ``-w A dlogp`` matters.

    Args:
        logp (torch.Tensor): ``[B, L]`` trained policy's log-probs of the sampled tokens.
        old_logp (torch.Tensor): ``[B, L]`` behaviour/proximal log-probs (constant).
        advantages (torch.Tensor): ``[B]`` per sequence or ``[B, L]`` per token (constant).
        mask (torch.Tensor): ``[B, L]`` bool or 0/1 float; 1 marks trained tokens.
        epsilon (float): lower clip bound ``1 - epsilon``.
        epsilon_high (float | None): upper bound ``1 + epsilon_high``; None: ``epsilon``.

    Returns:
        tuple: ``loss [B, L]`` and metrics ``clip_frac`` (share of masked tokens whose
        weight was capped), ``ratio_mean``, ``approx_kl``.
    """
    logp, old_logp, adv, m, eps_high = _prepare(logp, old_logp, advantages, mask, epsilon, epsilon_high)
    log_ratio = (logp - old_logp).detach()  # [B, L]
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))  # [B, L], no grad
    weight = ratio.clamp(max=1.0 + eps_high)  # [B, L]
    loss = -weight * adv * logp * m  # [B, L]
    return loss, _metrics(ratio > 1.0 + eps_high, ratio, log_ratio, m)


POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, Metrics]]] = {
    "ppo_clip": ppo_clip_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
}


def get_policy_loss(name: str) -> Callable[..., tuple[torch.Tensor, Metrics]]:
    """Look up a policy loss in :data:`POLICY_LOSSES` by name.

    Args:
        name (str): ``"ppo_clip"``, ``"gspo"`` or ``"cispo"``.

    Returns:
        Callable: ``fn(logp, old_logp, advantages, mask, epsilon=..., epsilon_high=...)``.

    Raises:
        ValueError: ``name`` is not registered; the message lists the allowed names.
    """
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        allowed = ", ".join(sorted(POLICY_LOSSES))
        raise ValueError(f"unknown policy loss {name!r}; allowed: {allowed}") from None


def kl_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, estimator: KLEstimator = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman 2020,
    *Approximating KL Divergence*, http://joschu.net/blog/kl-approx.html).

    With ``d = logp - ref_logp``: ``k1 = d`` (unbiased, high variance, can be negative);
    ``k2 = d^2 / 2`` (biased, low variance); ``k3 = exp(x) - x - 1`` with
    ``x = clamp(-d, -20, 20)`` (unbiased, low variance, always >= 0; GRPO's choice).

    Args:
        logp (torch.Tensor): ``[B, L]`` policy log-probs of the sampled tokens.
        ref_logp (torch.Tensor): ``[B, L]`` reference-model log-probs of the same tokens.
        estimator (str): ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        torch.Tensor: ``[B, L]`` per-token penalty (not masked; aggregate it with a mask).
    """
    d = logp - ref_logp  # [B, L]
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        x = (-d).clamp(-20.0, 20.0)  # [B, L]
        return torch.exp(x) - x - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; allowed: k1, k2, k3")


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of the softmax over the last dimension, ``H = logsumexp(z) - sum softmax(z) z``.

    The logsumexp form is stable for large logits; ``-inf`` logits (masked vocabulary) are
    handled. Computed in at least float32; rows are processed ``chunk_size`` positions at a
    time so that only a ``[chunk_size, V]`` temporary exists at once.

    Args:
        logits (torch.Tensor): ``[B, L, V]`` (any leading shape ``[..., V]`` works).
        chunk_size (int | None): positions per chunk over the flattened leading dims;
            ``None`` processes everything at once.

    Returns:
        torch.Tensor: ``[B, L]`` entropies in nats, dtype of ``logits``.
    """
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])  # [B*L, V]
    step = flat.shape[0] if chunk_size is None else chunk_size
    if step <= 0 and flat.shape[0] > 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    work_dtype = torch.promote_types(logits.dtype, torch.float32)
    parts = []
    for start in range(0, flat.shape[0], max(step, 1)):
        z = flat[start : start + step].to(work_dtype)  # [C, V]
        # a row without a finite log-normaliser (only -inf logits, or a +inf one) has no
        # distribution: entropy 0. Its logits are zeroed *before* softmax so that no NaN
        # exists in the graph: torch.where after the fact hides it from the value but not from
        # the backward pass (0 * NaN = NaN would reach every parameter).
        ok = torch.isfinite(torch.logsumexp(z.detach(), dim=-1))  # [C]
        z = torch.where(ok.unsqueeze(-1), z, torch.zeros_like(z))  # [C, V]
        lse = torch.logsumexp(z, dim=-1)  # [C]
        p = torch.softmax(z, dim=-1)  # [C, V]
        z_safe = torch.where(torch.isfinite(z), z, torch.zeros_like(z))  # [C, V]; p = 0 there
        pz = (p * z_safe).sum(-1)  # [C]
        parts.append(torch.where(ok, lse - pz, torch.zeros_like(lse)))
    if not parts:
        return logits.new_zeros(lead)
    return torch.cat(parts).reshape(lead).to(logits.dtype)  # [B, L]
