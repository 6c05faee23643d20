"""Turn items into prompt text and token ids.

The user message is the question, a newline and `cfg.instruction`. With
`use_chat_template` and a tokenizer that has a chat template, it is wrapped as chat
messages (with `cfg.system_prompt` as a system message when set) and rendered with
`apply_chat_template(..., add_generation_prompt=True)`. If the template refuses a system
message (or renders it as nothing), the system prompt is put in front of the user message instead. With
`use_chat_template: false` the plain user text is the prompt, and the system prompt is not
used (`rollwise train` warns of a system prompt set). With `use_chat_template` and a tokenizer
without a chat template (or a template that fails), the prompt is plain text too, with the
system prompt and a blank line in front of the user text: it may hold the answer format the
reward reads.
"""

from __future__ import annotations

import logging
from typing import Any

from rollwise.config import DataConfig
from rollwise.types import PromptItem

log = logging.getLogger(__name__)
_warned: set[str] = set()


def user_text(item: PromptItem, cfg: DataConfig) -> str:
    """The question followed by the instruction (when there is one)."""
    return f"{item.question}\n{cfg.instruction}" if cfg.instruction else item.question


def _drops_system(tokenizer: Any, out: str, system: str, user: dict[str, str]) -> bool:
    """Whether the template renders the system message as nothing: `out` (rendered with it) is what another
    system message gives too. (Not compared with the user message alone: a template may put a default system
    message there, the very one given.)"""
    other = [{"role": "system", "content": f"{system}\n(another system message)"}, user]
    try:
        return out == str(tokenizer.apply_chat_template(other, tokenize=False, add_generation_prompt=True))
    except Exception:  # noqa: BLE001
        return False


def _render(item: PromptItem, tokenizer: Any, cfg: DataConfig) -> tuple[str, bool]:
    """(prompt text, whether a chat template rendered it)."""
    text = user_text(item, cfg)
    if not cfg.use_chat_template:
        return text, False
    plain = f"{cfg.system_prompt}\n\n{text}" if cfg.system_prompt else text  # the system prompt kept, not dropped
    if not getattr(tokenizer, "chat_template", None):
        if "no_template" not in _warned:
            _warned.add("no_template")
            log.warning("tokenizer has no chat template; using plain-text prompts%s",
                        " (data.system_prompt in front of the question)" if cfg.system_prompt else "")
        return plain, False
    user = {"role": "user", "content": text}
    attempts = [[user]]
    if cfg.system_prompt:
        merged = {"role": "user", "content": f"{cfg.system_prompt}\n\n{text}"}
        attempts = [[{"role": "system", "content": cfg.system_prompt}, user], [merged]]
    error: Exception | None = None
    for messages in attempts:
        try:
            out = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001  (a template that rejects the system role)
            error = e
            continue
        if len(messages) == 2 and _drops_system(tokenizer, str(out), cfg.system_prompt or "", user):
            if "system_dropped" not in _warned:  # (Phi-3-mini's first template) as if it refused it
                _warned.add("system_dropped")
                log.warning("the chat template drops a system message; data.system_prompt goes in front of the question")
            continue
        return str(out), True
    if "template_error" not in _warned:
        _warned.add("template_error")
        log.warning("chat template failed (%s: %s); using plain-text prompts", type(error).__name__, error)
    return plain, False


def format_prompt(item: PromptItem, tokenizer: Any, cfg: DataConfig) -> str:
    """The prompt text for one item (see the module docstring)."""
    return _render(item, tokenizer, cfg)[0]


def encode_prompts(
    items: list[PromptItem], tokenizer: Any, cfg: DataConfig
) -> tuple[list[list[int]], list[str]]:
    """(token ids of every item, uids of the items longer than cfg.max_prompt_length).

    `ids[i]` belongs to `items[i]` (dropped items keep their entry, so positions line up);
    callers skip the uids in `dropped`. Chat-rendered text already holds the template's
    special tokens, so only plain text gets the tokenizer's own special tokens (such as BOS).
    """
    ids: list[list[int]] = []
    dropped: list[str] = []
    for item in items:
        text, templated = _render(item, tokenizer, cfg)
        tokens = list(tokenizer(text, add_special_tokens=not templated)["input_ids"])
        if len(tokens) > cfg.max_prompt_length:
            dropped.append(item.uid)
        ids.append(tokens)
    return ids, dropped
