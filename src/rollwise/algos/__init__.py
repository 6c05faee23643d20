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

__all__ = [
    "ADVANTAGES",
    "LOSS_TYPES",
    "POLICY_LOSSES",
    "aggregate_loss",
    "cispo_loss",
    "entropy_from_logits",
    "get_advantage_fn",
    "get_policy_loss",
    "grpo_advantages",
    "gspo_loss",
    "kl_penalty",
    "masked_mean",
    "ppo_clip_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
]
