"""RL algorithms as pure functions on tensors: advantages, policy losses, aggregation.

No config objects and no state: the trainer wires these together, e.g.::

    adv = get_advantage_fn("grpo")(rewards, group_ids, scale="group")      # [N]
    loss_tok, metrics = get_policy_loss("ppo_clip")(logp, old_logp, adv, mask)  # [B, L]
    loss = aggregate_loss(loss_tok, mask, "dapo", num_tokens=batch_tokens)  # scalar
"""

from rollwise.algos.advantages import (
    ADVANTAGES,
    get_advantage_fn,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rollwise.algos.aggregation import LOSS_TYPES, aggregate_loss, masked_mean
from rollwise.algos.losses import (
    POLICY_LOSSES,
    cispo_loss,
    entropy_from_logits,
    get_policy_loss,
    gspo_loss,
    kl_penalty,
    ppo_clip_loss,
)
from rollwise.algos.offpolicy import (
    OFFPOLICY_CORRECTIONS,
    Correction,
    decoupled_correction,
    get_offpolicy_correction,
    icepop_correction,
    m2po_correction,
    mask_resumed_correction,
    recompute_correction,
    tis_correction,
)
from rollwise.algos.speculative import (
    residual_distribution,
    reuse_metrics,
    speculative_accept,
    speculative_accept_batch,
)

__all__ = [
    "ADVANTAGES",
    "LOSS_TYPES",
    "OFFPOLICY_CORRECTIONS",
    "POLICY_LOSSES",
    "Correction",
    "aggregate_loss",
    "cispo_loss",
    "decoupled_correction",
    "entropy_from_logits",
    "get_advantage_fn",
    "get_offpolicy_correction",
    "get_policy_loss",
    "grpo_advantages",
    "gspo_loss",
    "icepop_correction",
    "kl_penalty",
    "m2po_correction",
    "mask_resumed_correction",
    "masked_mean",
    "ppo_clip_loss",
    "recompute_correction",
    "reinforce_pp_advantages",
    "residual_distribution",
    "reuse_metrics",
    "rloo_advantages",
    "speculative_accept",
    "speculative_accept_batch",
    "tis_correction",
]
