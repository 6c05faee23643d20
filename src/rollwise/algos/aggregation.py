"""Reduce a per-token loss ``[B, L]`` to the scalar that is back-propagated.

The three normalisations follow the papers that introduced them:

- ``"grpo"``: mean over sequences of each sequence's token mean (Shao et al. 2024,
  *DeepSeekMath*, arXiv:2402.03300). Long responses get the same total weight as short ones.
- ``"dapo"``: token mean over the whole batch (Yu et al. 2025, *DAPO*, arXiv:2503.14476).
- ``"dr_grpo"``: token sum divided by a constant ``num_sequences * max_completion_length``
  (Liu et al. 2025, *Understanding R1-Zero-Like Training*, arXiv:2503.20783), which removes
  the length bias of the per-sequence mean.

Micro-batching. ``num_tokens`` and ``num_sequences`` let the trainer pass the normalisers
of the *whole* batch while calling :func:`aggregate_loss` on a slice of it. All three
modes are then linear in the rows, so summing the micro-batch losses (and accumulating
their gradients) gives exactly the loss and gradient of one call on the whole batch. This
also holds when rows are dropped from the micro-batches (for example rows whose advantage
is exactly 0, whose per-token loss is 0), provided their tokens and sequences are still
counted in the normalisers.

Empty masks never give NaN: the result is a zero that stays connected to ``loss``'s graph,
so ``backward()`` works and yields zero gradients.
"""

from __future__ import annotations

from typing import Literal

import torch

LossType = Literal["grpo", "dapo", "dr_grpo"]
LOSS_TYPES: tuple[str, ...] = ("grpo", "dapo", "dr_grpo")


def _as_denominator(value: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A normaliser as a tensor on ``like``'s device and dtype, with 0 replaced by 1.

    Replacing 0 by 1 is exact: a zero normaliser only occurs when every numerator is 0.
    """
    denom = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    return torch.where(denom != 0, denom, torch.ones_like(denom))


def _masked(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``x * mask`` with masked positions exactly 0, and ``mask`` in ``x``'s dtype.

    ``torch.where`` (rather than a plain product) keeps NaN/inf held at padded positions
    out of the forward value.
    """
    if mask.shape != x.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != tensor shape {tuple(x.shape)}")
    m = mask.to(x.dtype)  # same shape as x
    return torch.where(m != 0, x * m, torch.zeros_like(x)), m


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, dim: int | None = None
) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is non-zero; 0 where there are none.

    Args:
        x (torch.Tensor): values, any shape, e.g. ``[B, L]``.
        mask (torch.Tensor): same shape as ``x``; bool or 0/1 float.
        dim (int | None): reduce only this dimension (``None``: reduce everything).

    Returns:
        torch.Tensor: a scalar (``dim=None``) or ``x`` reduced along ``dim``. Empty
        selections give exactly 0, never NaN.
    """
    xm, m = _masked(x, mask)
    if dim is None:
        return xm.sum() / _as_denominator(m.sum(), xm)
    return xm.sum(dim) / _as_denominator(m.sum(dim), xm)


def aggregate_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: LossType,
    max_completion_length: int | None = None,
    num_tokens: float | torch.Tensor | None = None,
    num_sequences: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar (see the module docstring for the papers).

    With ``m = mask`` and ``S = sum(loss * m)``:

    - ``"dapo"``: ``S / num_tokens``; ``num_tokens`` defaults to ``m.sum()``.
    - ``"grpo"``: ``sum_b (sum_t loss[b] m[b] / sum_t m[b]) / num_sequences``;
      ``num_sequences`` defaults to ``B``, rows without tokens contribute 0 (but, by default,
      still count in ``B``, as in TRL).
    - ``"dr_grpo"``: ``S / (num_sequences * max_completion_length)``; ``num_sequences``
      defaults to ``B``.

    Args:
        loss (torch.Tensor): per-token loss ``[B, L]``. Masked positions may hold any value
            (even NaN/inf); they do not reach the forward value.
        mask (torch.Tensor): ``[B, L]`` bool or 0/1 float; 1 marks trained tokens.
        loss_type (str): ``"grpo"``, ``"dapo"`` or ``"dr_grpo"``.
        max_completion_length (int | None): the generation length cap; required for
            ``"dr_grpo"``, ignored otherwise.
        num_tokens (float | int | torch.Tensor | None): ``"dapo"`` normaliser. Pass the
            token count of the whole batch when ``loss`` is a micro-batch of it.
        num_sequences (float | int | torch.Tensor | None): ``"grpo"``/``"dr_grpo"``
            normaliser. Pass the row count of the whole batch when ``loss`` is a micro-batch.

    Returns:
        torch.Tensor: scalar loss. With an empty mask (or a zero normaliser) it is 0.0,
        still attached to ``loss``'s autograd graph when ``loss`` requires grad.

    Raises:
        ValueError: unknown ``loss_type``, shapes that are not ``[B, L]``, a negative
            normaliser, or ``"dr_grpo"`` without a positive ``max_completion_length``.
    """
    if loss.dim() != 2:
        raise ValueError(f"loss must be [B, L], got shape {tuple(loss.shape)}")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; allowed: {', '.join(LOSS_TYPES)}")
    for name, value in (("num_tokens", num_tokens), ("num_sequences", num_sequences)):
        if value is not None and not isinstance(value, torch.Tensor) and value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")

    masked_loss, m = _masked(loss, mask)  # [B, L], [B, L]
    name, value = ("num_tokens", num_tokens) if loss_type == "dapo" else ("num_sequences", num_sequences)
    if value is not None and not isinstance(value, torch.Tensor) and value == 0 and bool(m.any()):
        raise ValueError(f"{name}=0 with tokens in the mask: a normaliser counts at least the tokens it divides")
    batch_size = loss.shape[0]
    seqs = batch_size if num_sequences is None else num_sequences

    if loss_type == "dapo":
        tokens = m.sum() if num_tokens is None else num_tokens
        return masked_loss.sum() / _as_denominator(tokens, masked_loss)

    if loss_type == "grpo":
        row_sum = masked_loss.sum(-1)  # [B]
        row_mean = row_sum / _as_denominator(m.sum(-1), masked_loss)  # [B]; empty rows -> 0
        return row_mean.sum() / _as_denominator(seqs, masked_loss)

    # dr_grpo
    if max_completion_length is None or max_completion_length <= 0:
        raise ValueError(
            "loss_type='dr_grpo' needs a positive max_completion_length, "
            f"got {max_completion_length!r}"
        )
    denom = _as_denominator(seqs, masked_loss) * max_completion_length
    return masked_loss.sum() / denom
