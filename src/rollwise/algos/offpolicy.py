"""Off-policy corrections for resumed (partial-rollout) and stale tokens.

Three policies meet in one update: the *behaviour* policy that generated a token (the
engine's per-token log-probs, possibly from an older weight version and always from a
different kernel), the *proximal* policy (the weights at the start of this update, no
grad) and the *current* policy being trained. Each correction returns a
:class:`Correction`, which the trainer uses as::

    c = get_offpolicy_correction("tis")(logp, behaviour_logp, mask, resumed_mask, prox_logp)
    loss_tok, m = get_policy_loss("ppo_clip")(logp, c.old_logp, adv, c.mask)  # [B, L]
    loss = aggregate_loss(loss_tok * c.weight, c.mask, "dapo")                # scalar

All corrections share the signature ``(logp, behaviour_logp, mask, resumed_mask=None,
prox_logp=None, advantages=None, **options)``. ``prox_logp=None`` means the current
policy, detached, is the proximal policy; that is exact when each batch gets a single
optimizer step. Below, ``ref`` is ``prox_logp`` if given, else ``logp.detach()``, and the
training/behaviour ratio is ``exp(ref - behaviour_logp)``, its log clamped to ``[-20, 20]``.
Tokens a correction masks out also leave the aggregation normaliser when the trainer
counts ``c.mask`` (as above). ``advantages`` is accepted so that the trainer can call every
correction the same way; none of the corrections here reads it. Metrics are detached
scalars: ``kept_frac`` (kept / input tokens), ``weight_mean`` (over kept tokens),
``behaviour_kl`` (mean over input tokens of ``behaviour_logp - ref``, the k1 estimate of
KL(behaviour || proximal)), plus per-method ones. Empty masks give zeros, never NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rollwise.algos.aggregation import masked_mean

Metrics = dict[str, torch.Tensor]


@dataclass
class Correction:
    """What the trainer needs from an off-policy correction; all tensors are detached.

    Attributes:
        old_logp (torch.Tensor): ``[B, L]`` log-probs for the denominator of the PPO ratio;
            at positions outside the input mask, ``logp`` detached (0 where not finite).
        weight (torch.Tensor): ``[B, L]`` factor on the per-token loss; 0 where ``mask`` is 0.
        mask (torch.Tensor): ``[B, L]`` final 0/1 loss mask in ``logp``'s dtype.
        metrics (dict): detached scalar tensors for logging.
    """

    old_logp: torch.Tensor
    weight: torch.Tensor
    mask: torch.Tensor
    metrics: Metrics = field(default_factory=dict)


def _setup(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    mask: torch.Tensor,
    resumed_mask: torch.Tensor | None,
    prox_logp: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate; return ``(ref [B, L], log_ratio = ref - behaviour [B, L], mask [B, L] float)``."""
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, L], got shape {tuple(logp.shape)}")
    others = {"behaviour_logp": behaviour_logp, "mask": mask, "resumed_mask": resumed_mask, "prox_logp": prox_logp}
    for name, t in others.items():
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logp shape {tuple(logp.shape)}")
    ref = (logp if prox_logp is None else prox_logp).detach().to(logp.dtype)  # [B, L]
    log_ratio = (ref - behaviour_logp.detach().to(logp.dtype)).clamp(-20.0, 20.0)  # [B, L]
    m = (mask != 0).to(logp.dtype)  # [B, L]
    # masked positions may hold -inf/NaN log-probs: keep them out of every output
    log_ratio = torch.where(m != 0, log_ratio, torch.zeros_like(log_ratio))
    pad = logp.detach()  # [B, L]; ratio 1 at masked positions where logp is finite
    ref = torch.where(m != 0, ref, torch.where(torch.isfinite(pad), pad, torch.zeros_like(pad)))
    return ref, log_ratio, m


def _finish(
    ref: torch.Tensor,
    log_ratio: torch.Tensor,
    weight: torch.Tensor,
    m_in: torch.Tensor,
    m_out: torch.Tensor,
    resumed_mask: torch.Tensor | None,
    extra: Metrics | None = None,
) -> Correction:
    with torch.no_grad():
        weight = weight * m_out  # [B, L]
        n_in = m_in.sum()
        metrics: Metrics = {
            "kept_frac": m_out.sum() / torch.where(n_in > 0, n_in, torch.ones_like(n_in)),
            "weight_mean": masked_mean(weight, m_out),
            "behaviour_kl": masked_mean(-log_ratio, m_in),
        }
        if resumed_mask is not None:
            metrics["resumed_frac"] = masked_mean((resumed_mask != 0).to(m_in.dtype), m_in)
        metrics.update(extra or {})
    return Correction(old_logp=ref, weight=weight.detach(), mask=m_out, metrics=metrics)


def recompute_correction(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, resumed_mask: torch.Tensor | None = None,
    prox_logp: torch.Tensor | None = None, advantages: torch.Tensor | None = None,
) -> Correction:
    """Treat every token as on-policy (APRIL, as run with Megatron's recomputed log-probs).

    ``old_logp = ref``, ``weight = 1``, ``mask`` unchanged; the behaviour log-probs only
    feed the ``behaviour_kl`` metric.

    Args:
        logp (torch.Tensor): ``[B, L]`` current policy's log-probs (with grad).
        behaviour_logp (torch.Tensor): ``[B, L]`` engine log-probs of the sampled tokens.
        mask (torch.Tensor): ``[B, L]`` bool or 0/1; 1 marks response tokens.
        resumed_mask (torch.Tensor | None): ``[B, L]``; 1 on resumed-prefix / stale tokens.
        prox_logp (torch.Tensor | None): ``[B, L]`` proximal log-probs; None: ``logp`` detached.
        advantages (torch.Tensor | None): ``[B]``; unused.

    Returns:
        Correction: see the class.
    """
    ref, log_ratio, m = _setup(logp, behaviour_logp, mask, resumed_mask, prox_logp)
    return _finish(ref, log_ratio, torch.ones_like(m), m, m, resumed_mask)


def mask_resumed_correction(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, resumed_mask: torch.Tensor | None = None,
    prox_logp: torch.Tensor | None = None, advantages: torch.Tensor | None = None,
) -> Correction:
    """Train only on each sample's tokens of its newest policy version (slime's
    ``--mask-offpolicy-in-partial-rollout``): a resumed prefix is context. A sample generated whole
    under one older policy (one that waited in the carry buffer for the rest of its group) is trained
    whole; its staleness is left to the PPO ratio.

    ``mask_out = mask * (1 - resumed_mask)``, ``old_logp = ref``, ``weight = 1``. Arguments
    as in :func:`recompute_correction`; ``resumed_mask`` is required.
    """
    if resumed_mask is None:
        raise ValueError("mask_resumed needs resumed_mask")
    ref, log_ratio, m = _setup(logp, behaviour_logp, mask, resumed_mask, prox_logp)
    m_out = m * (resumed_mask == 0).to(m.dtype)  # [B, L]
    return _finish(ref, log_ratio, torch.ones_like(m), m, m_out, resumed_mask)


def tis_correction(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, resumed_mask: torch.Tensor | None = None,
    prox_logp: torch.Tensor | None = None, advantages: torch.Tensor | None = None,
    cap: float = 2.0,
) -> Correction:
    """Truncated importance sampling (Yao et al. 2025, *Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training*; slime ``--use-tis``, C = 2).

    ``weight = min(exp(ref - behaviour_logp), cap)`` on every token, ``old_logp = ref``,
    ``mask`` unchanged. Extra metric ``clip_frac``: share of tokens whose weight was capped.
    Arguments as in :func:`recompute_correction`, plus ``cap`` (C > 0).
    """
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    ref, log_ratio, m = _setup(logp, behaviour_logp, mask, resumed_mask, prox_logp)
    ratio = torch.exp(log_ratio)  # [B, L]
    extra = {"clip_frac": masked_mean((ratio > cap).to(m.dtype), m)}
    return _finish(ref, log_ratio, ratio.clamp(max=cap), m, m, resumed_mask, extra)


def decoupled_correction(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, resumed_mask: torch.Tensor | None = None,
    prox_logp: torch.Tensor | None = None, advantages: torch.Tensor | None = None,
    cap: float | None = None,
) -> Correction:
    """Decoupled PPO (Fu et al. 2025, *AReaL*, arXiv:2505.24298).

    ``J = E[(pi_prox / pi_behav) * min(r A, clip(r) A)]`` with ``r = pi_theta / pi_prox``:
    ``old_logp = prox_logp`` (the clip acts around the proximal policy) and
    ``weight = exp(prox_logp - behaviour_logp)``, clamped to ``cap`` when given (uncapped by
    default, as in AReaL). With ``prox_logp=None`` and one optimizer step per batch it
    equals uncapped TIS. Arguments as in :func:`recompute_correction`, plus ``cap``.
    """
    if cap is not None and cap <= 0:
        raise ValueError(f"cap must be > 0 or None, got {cap}")
    ref, log_ratio, m = _setup(logp, behaviour_logp, mask, resumed_mask, prox_logp)
    ratio = torch.exp(log_ratio)  # [B, L]
    capped = torch.zeros_like(m) if cap is None else (ratio > cap).to(m.dtype)
    weight = ratio if cap is None else ratio.clamp(max=cap)
    return _finish(ref, log_ratio, weight, m, m, resumed_mask, {"clip_frac": masked_mean(capped, m)})


def m2po_correction(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, resumed_mask: torch.Tensor | None = None,
    prox_logp: torch.Tensor | None = None, advantages: torch.Tensor | None = None,
    tau: float = 0.04,
) -> Correction:
    """Second-moment trust-region masking (M2PO, arXiv:2510.01161, Algorithm 1; as in AReaL).

    Rule: ``M2 = (ref - behaviour_logp)^2`` on every input token of the whole call (batch or
    micro-batch). Sort the N values ascending (stable, ties by flat index) and keep the
    largest prefix of k tokens whose mean ``sum(M2[:k]) / k <= tau`` (prefix means of a sorted
    list never decrease, so this equals masking the largest ``M2`` one by one until the mean
    of the rest is ``<= tau``). If even the smallest exceeds ``tau``, keep that one token.
    ``old_logp = ref``, ``weight = 1``. The paper pairs this with an *unclipped* ratio, so
    use a policy loss with wide clip ranges. Extra metrics: ``masked_frac``, ``m2_before``
    and ``m2_after`` (mean ``M2`` over input / kept tokens). Arguments as in
    :func:`recompute_correction`, plus ``tau``.
    """
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    ref, log_ratio, m = _setup(logp, behaviour_logp, mask, resumed_mask, prox_logp)
    m2 = log_ratio.square()  # [B, L]
    flat_m = m.reshape(-1) != 0  # [B*L]
    idx = flat_m.nonzero().squeeze(-1)  # [N]
    m_out = torch.zeros_like(m).reshape(-1)  # [B*L]
    if idx.numel() > 0:
        vals = m2.reshape(-1)[idx]  # [N]
        order = torch.sort(vals, stable=True).indices  # [N]
        prefix_mean = vals[order].cumsum(0) / torch.arange(1, len(vals) + 1, dtype=vals.dtype, device=vals.device)  # [N]
        ok = (prefix_mean <= tau).nonzero()
        k = int(ok.max()) + 1 if ok.numel() > 0 else 1
        m_out[idx[order[:k]]] = 1.0
    m_out = m_out.reshape(m.shape)  # [B, L]
    extra = {
        "masked_frac": masked_mean(m - m_out, m),
        "m2_before": masked_mean(m2, m),
        "m2_after": masked_mean(m2, m_out),
    }
    return _finish(ref, log_ratio, torch.ones_like(m), m, m_out, resumed_mask, extra)


def icepop_correction(
    logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, resumed_mask: torch.Tensor | None = None,
    prox_logp: torch.Tensor | None = None, advantages: torch.Tensor | None = None,
    low: float = 0.5,
    high: float = 2.0,
    weighted: bool = True,
) -> Correction:
    """IcePop discrepancy masking (Ling Team 2025, *Every Step Evolves* / Ring-1T, arXiv:2510.18855).

    ``k = exp(ref - behaviour_logp)``; tokens with ``k`` outside ``[low, high]`` are masked.
    The paper's ``M(k) = k`` inside the band, 0 outside, so kept tokens get
    ``weight = k`` (``weighted=False``: weight 1, a pure mask). The paper's band is
    ``[0.5, 5]``; the default here is the narrower ``[0.5, 2]``. ``old_logp = ref``. Extra
    metric ``masked_frac``. Arguments as in :func:`recompute_correction`, plus the band.
    """
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, got [{low}, {high}]")
    ref, log_ratio, m = _setup(logp, behaviour_logp, mask, resumed_mask, prox_logp)
    ratio = torch.exp(log_ratio)  # [B, L]
    m_out = m * ((ratio >= low) & (ratio <= high)).to(m.dtype)  # [B, L]
    weight = ratio if weighted else torch.ones_like(m)
    extra = {"masked_frac": masked_mean(m - m_out, m)}
    return _finish(ref, log_ratio, weight, m, m_out, resumed_mask, extra)


OFFPOLICY_CORRECTIONS: dict[str, Callable[..., Correction]] = {
    "recompute": recompute_correction,
    "mask_resumed": mask_resumed_correction,
    "tis": tis_correction,
    "decoupled": decoupled_correction,
    "m2po": m2po_correction,
    "icepop": icepop_correction,
}


def get_offpolicy_correction(name: str) -> Callable[..., Correction]:
    """Look up a correction in :data:`OFFPOLICY_CORRECTIONS` by name.

    Args:
        name (str): ``"recompute"``, ``"mask_resumed"``, ``"tis"``, ``"decoupled"``,
            ``"m2po"`` or ``"icepop"``.

    Returns:
        Callable: ``fn(logp, behaviour_logp, mask, resumed_mask=None, prox_logp=None,
        advantages=None, **options) -> Correction``.

    Raises:
        ValueError: ``name`` is not registered; the message lists the allowed names.
    """
    try:
        return OFFPOLICY_CORRECTIONS[name]
    except KeyError:
        allowed = ", ".join(sorted(OFFPOLICY_CORRECTIONS))
        raise ValueError(f"unknown off-policy correction {name!r}; allowed: {allowed}") from None
