"""The records that flow through rollwise: a prompt item in, a Sample out.

Tokens, never text, are the truth: a Sample keeps the prompt and response token ids, the
behaviour policy's per-token log-probs and the policy version that produced each token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "aborted"]


@dataclass
class PromptItem:
    """One question with a verifiable answer.

    `uid` is stable across the run (the planner keys its beliefs on it); `task` names the
    source (a reasoning-gym generator or a file label); `entry` is what the task's scorer
    needs (for reasoning-gym, the generator's full entry dict with `question`, `answer`,
    `metadata`).
    """

    uid: str
    task: str
    question: str
    answer: str
    entry: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        """`item["answer"]` reads `item.answer`, as a reward function written for rows of a dataset expects; a
        key that is no field is looked up in `entry` (a reasoning-gym item's `metadata`)."""
        if key in _ITEM_FIELDS:
            return getattr(self, key)
        if key in self.entry:
            return self.entry[key]
        raise KeyError(f"{key!r}: a prompt item has {', '.join(_ITEM_FIELDS)}"
                       + (f", and its entry {', '.join(map(repr, self.entry))}" if self.entry else ""))

    def __contains__(self, key: object) -> bool:  # `"answer" in item`; without it Python indexed the item with 0
        return key in _ITEM_FIELDS or key in self.entry

    def keys(self) -> list[str]:  # `dict(item)`
        return [*_ITEM_FIELDS, *(k for k in self.entry if k not in _ITEM_FIELDS)]

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


_ITEM_FIELDS = ("uid", "task", "question", "answer", "entry")


@dataclass
class Sample:
    """One generated response and everything the trainer needs to learn from it."""

    prompt_uid: str
    group_id: int
    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]  # one per response token
    versions: list[int]  # policy version that produced each response token
    finish_reason: FinishReason
    text: str = ""
    reward: float = 0.0
    reward_parts: dict[str, float] = field(default_factory=dict)
    advantage: float = 0.0
    task: str = ""
    stop_gradient: bool = False  # a replayed response: counts in group statistics, gets no gradient

    @property
    def num_response_tokens(self) -> int:
        return len(self.response_ids)
