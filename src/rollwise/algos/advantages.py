"""Outcome-reward advantage estimators with a group baseline (one scalar per sample).

A *group* is the set of samples drawn for the same prompt; ``group_ids[i]`` names the group
of sample ``i``. Groups may be non-contiguous and of different sizes. Shared conventions:

- A group of one sample has no baseline to compare against: its advantage is exactly 0.
- A group whose rewards are all equal carries no learning signal: its advantage is set to
  exactly 0 explicitly, so floating-point noise in the group mean (e.g. three rewards of
  0.1) can never be amplified into a gradient by a division by a near-zero std.
- Rewards must be finite (map unscorable samples to a reward, or drop them, first).

Samples replayed with a stopped gradient are the caller's business: compute advantages on
the group as usual and mask those samples out of the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import torch

Scale = Literal["group", "batch", "none"]


class _Groups(NamedTuple):
    mean: torch.Tensor  # [N] mean reward of each sample's group
    std: torch.Tensor  # [N] unbiased std of each sample's group (0 for singletons)
    count: torch.Tensor  # [N] size of each sample's group
    group_sum: torch.Tensor  # [N] reward sum of each sample's group
    degenerate: torch.Tensor  # [N] bool: singleton group or all-equal rewards


def _check(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [N], got shape {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids shape {tuple(group_ids.shape)} != rewards shape {tuple(rewards.shape)}"
        )
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be finite (got NaN or inf)")
    return rewards


def _groups(rewards: torch.Tensor, group_ids: torch.Tensor) -> _Groups:
    """Per-sample statistics of each sample's group. ``rewards`` [N] float, ``group_ids`` [N]."""
    uniq, inv = torch.unique(group_ids, return_inverse=True)  # [G], [N]
    g = uniq.numel()
    count = torch.bincount(inv, minlength=g).to(rewards.dtype)  # [G]
    total = rewards.new_zeros(g).index_add_(0, inv, rewards)  # [G]
    mean = total / count  # [G]; every group has >= 1 sample
    sq_dev = (rewards - mean[inv]) ** 2  # [N]
    ssq = rewards.new_zeros(g).index_add_(0, inv, sq_dev)  # [G]
    std = (ssq / (count - 1).clamp(min=1)).sqrt()  # [G] unbiased; 0 for singletons
    hi = rewards.new_empty(g).scatter_reduce_(0, inv, rewards, "amax", include_self=False)
    lo = rewards.new_empty(g).scatter_reduce_(0, inv, rewards, "amin", include_self=False)
    degenerate = (count < 2) | (hi == lo)  # [G]
    return _Groups(mean[inv], std[inv], count[inv], total[inv], degenerate[inv])


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    scale: Scale = "group",
    eps: float = 1e-4,
) -> torch.Tensor:
    """GRPO advantages (Shao et al. 2024, *DeepSeekMath*, arXiv:2402.03300).

    ``A_i = r_i - mean_g(r)``, then divided by

    - ``"group"``: ``std_g(r) + eps`` (unbiased group std; the GRPO paper, TRL's default);
    - ``"batch"``: ``std(r) + eps`` over the whole batch (unbiased; Hu et al. 2025's
      batch-level scaling, TRL's ``scale_rewards="batch"``);
    - ``"none"``: nothing (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783).

    Singleton and all-equal groups get exactly 0.

    Args:
        rewards (torch.Tensor): ``[N]`` scalar reward per sample (finite).
        group_ids (torch.Tensor): ``[N]`` integer group id per sample.
        scale (str): ``"group"``, ``"batch"`` or ``"none"``.
        eps (float): added to the std before dividing.

    Returns:
        torch.Tensor: ``[N]`` advantages, floating dtype of ``rewards``.
    """
    rewards = _check(rewards, group_ids)
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"unknown scale {scale!r}; allowed: group, batch, none")
    if rewards.numel() == 0:
        return rewards.clone()
    grp = _groups(rewards, group_ids)
    adv = rewards - grp.mean  # [N]
    if scale == "group":
        adv = adv / (grp.std + eps)
    elif scale == "batch":
        batch_std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
        adv = adv / (batch_std + eps)
    return torch.where(grp.degenerate, torch.zeros_like(adv), adv)


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out advantages (Kool et al. 2019; Ahmadian et al. 2024,
    *Back to Basics*, arXiv:2402.14740).

    ``A_i = r_i - mean_{j in g, j != i}(r_j) = (n r_i - sum_g r) / (n - 1)``.
    Singleton and all-equal groups get exactly 0.

    Args:
        rewards (torch.Tensor): ``[N]`` scalar reward per sample (finite).
        group_ids (torch.Tensor): ``[N]`` integer group id per sample.

    Returns:
        torch.Tensor: ``[N]`` advantages, floating dtype of ``rewards``.
    """
    rewards = _check(rewards, group_ids)
    if rewards.numel() == 0:
        return rewards.clone()
    grp = _groups(rewards, group_ids)
    adv = (grp.count * rewards - grp.group_sum) / (grp.count - 1).clamp(min=1)  # [N]
    return torch.where(grp.degenerate, torch.zeros_like(adv), adv)


def reinforce_pp_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """REINFORCE++ with a group baseline (Hu et al. 2025, *REINFORCE++*, arXiv:2501.03262).

    1. ``a_i = r_i - mean_g(r)``; singleton and all-equal groups get exactly 0.
    2. Whiten over the batch: ``(a - mean(a)) / (std(a) + eps)`` (unbiased std).

    Design choice: the whitening statistics are taken over the samples of the *non-zero*
    groups only, and the zero groups stay exactly 0. Whitening must not invent a gradient
    for zero-variance prompts: ``(0 - mean) / std`` is not 0 once the batch mean carries
    rounding error (the centred groups sum to 0 only up to rounding). Counting their zeros
    in the std would also make the scale depend on how many prompts happened to be
    all-solved or all-failed. If fewer than 2 entries are non-zero, whitening is skipped. Unlike verl's ``reinforce_plus_plus_baseline`` the
    statistics are per sample, not per token (long responses are not weighted up).

    Args:
        rewards (torch.Tensor): ``[N]`` scalar reward per sample (finite).
        group_ids (torch.Tensor): ``[N]`` integer group id per sample.
        eps (float): added to the batch std before dividing.

    Returns:
        torch.Tensor: ``[N]`` advantages, floating dtype of ``rewards``.
    """
    rewards = _check(rewards, group_ids)
    if rewards.numel() == 0:
        return rewards.clone()
    grp = _groups(rewards, group_ids)
    adv = torch.where(grp.degenerate, torch.zeros_like(rewards), rewards - grp.mean)  # [N]
    active = ~grp.degenerate  # [N]
    if int((adv != 0).sum()) < 2:
        return adv
    x = adv[active]  # [N_active], N_active >= 2 here
    whitened = (adv - x.mean()) / (x.std() + eps)  # [N]
    return torch.where(active, whitened, torch.zeros_like(adv))


ADVANTAGES: dict[str, Callable[..., torch.Tensor]] = {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}


def get_advantage_fn(name: str) -> Callable[..., torch.Tensor]:
    """Look up an advantage estimator in :data:`ADVANTAGES` by name.

    Args:
        name (str): ``"grpo"``, ``"rloo"`` or ``"reinforce_pp"``.

    Returns:
        Callable: ``fn(rewards [N], group_ids [N], **kwargs) -> [N]``.

    Raises:
        ValueError: ``name`` is not registered; the message lists the allowed names.
    """
    try:
        return ADVANTAGES[name]
    except KeyError:
        allowed = ", ".join(sorted(ADVANTAGES))
        raise ValueError(f"unknown advantage estimator {name!r}; allowed: {allowed}") from None
