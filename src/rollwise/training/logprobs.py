"""Per-token log-probs of response tokens, without materialising full-vocabulary logits
for the whole batch: the decoder runs once, the LM head and log-softmax run over chunks of
response tokens only (prompt positions never reach the LM head), and with gradients on
each chunk is recomputed in backward instead of keeping its [chunk, V] activations.

Two layouts of a batch. `pack` puts each sample's prompt and response in one row, so a group
of G samples runs its prompt through the decoder G times. `pack_shared` runs each distinct
prompt once and lets the responses attend to its keys and values, copied per row; gradients
reach the prompt positions through those copies (summed over the rows), so loss and gradient
are those of `pack` up to float rounding, for a fraction of the decoder work when prompts are
long against responses (train.share_prompt_forward).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from rollwise.models import cache_arg


@dataclass
class PackedBatch:
    """Sequences laid out as [left-padded prompt | right-padded response]."""

    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    position_ids: torch.Tensor  # [B, P + R]
    response_ids: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R] 1 on real response tokens
    prompt_len: int  # P

    def to(self, device: torch.device) -> PackedBatch:
        return PackedBatch(self.input_ids.to(device), self.attention_mask.to(device), self.position_ids.to(device),
                           self.response_ids.to(device), self.response_mask.to(device), self.prompt_len)


def pack(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> PackedBatch:
    B = len(prompts)
    P = max(len(p) for p in prompts)
    R = max(1, max(len(r) for r in responses))
    ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    rmask = torch.zeros((B, R), dtype=torch.float32)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        ids[b, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
        attn[b, P - len(p) : P] = 1
        if r:
            ids[b, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
            attn[b, P : P + len(r)] = 1
            rmask[b, : len(r)] = 1.0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return PackedBatch(ids, attn, pos, ids[:, P:].clone(), rmask, P)


@dataclass
class SharedPromptBatch:
    """Rows that share prompts: K distinct left-padded prompts, B right-padded responses."""

    prompt_ids: torch.Tensor  # [K, P]
    prompt_mask: torch.Tensor  # [K, P]
    row_prompt: torch.Tensor  # [B] index of each row's prompt
    response_ids: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R] 1 on real response tokens

    def to(self, device: torch.device) -> SharedPromptBatch:
        return SharedPromptBatch(self.prompt_ids.to(device), self.prompt_mask.to(device), self.row_prompt.to(device),
                                 self.response_ids.to(device), self.response_mask.to(device))


def pack_shared(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> SharedPromptBatch:
    """Like `pack`, with each distinct prompt (equal token ids) stored once."""
    first: dict[tuple[int, ...], int] = {}
    row_prompt = [first.setdefault(tuple(p), len(first)) for p in prompts]
    distinct = list(first)
    K, B = len(distinct), len(prompts)
    P = max(len(p) for p in distinct)
    R = max(1, max(len(r) for r in responses))
    pids = torch.full((K, P), pad_id, dtype=torch.long)
    pmask = torch.zeros((K, P), dtype=torch.long)
    for k, p in enumerate(distinct):
        pids[k, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        pmask[k, P - len(p) :] = 1
    rids = torch.full((B, R), pad_id, dtype=torch.long)
    rmask = torch.zeros((B, R), dtype=torch.float32)
    for b, r in enumerate(responses):
        if r:
            rids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
            rmask[b, : len(r)] = 1.0
    return SharedPromptBatch(pids, pmask, torch.tensor(row_prompt, dtype=torch.long), rids, rmask)


def _plain_layers(cache: Any) -> bool:
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def shares_prompts(model: torch.nn.Module) -> bool:
    """Whether `pack_shared` batches work with this model: its decoder returns a cache of plain
    dynamic layers (no sliding windows, no custom cache) and no gradient checkpointing (which
    turns the cache off in training)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # LoRA: the wrapped model
    name = "is_activation_checkpointing" if hasattr(type(base), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"  # renamed in transformers 5.x
    if getattr(base, name, False):
        return False
    decoder, _ = _decoder_and_head(model)
    try:
        with torch.no_grad():
            ids = torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device)
            out = decoder(input_ids=ids, use_cache=True)
    except Exception:  # noqa: BLE001 - any failure means: use the plain layout
        return False
    return _plain_layers(getattr(out, cache_arg(decoder), None))


def _shared_hidden(decoder: torch.nn.Module, batch: SharedPromptBatch) -> torch.Tensor:
    """[B, R, H] states that predict each response token, each prompt run once."""
    pmask, rows = batch.prompt_mask, batch.row_prompt
    ppos = (pmask.cumsum(-1) - 1).clamp(min=0)
    out = decoder(input_ids=batch.prompt_ids, attention_mask=pmask, position_ids=ppos, use_cache=True)
    name = cache_arg(decoder)
    cache = getattr(out, name)
    if not _plain_layers(cache):
        raise RuntimeError("train.share_prompt_forward: this model's cache cannot be shared between rows; "
                           "set train.share_prompt_forward=false")
    for layer in cache.layers:  # one copy of the prompt's keys and values per row
        layer.keys = layer.keys.index_select(0, rows)
        layer.values = layer.values.index_select(0, rows)
    R = batch.response_ids.shape[1]
    attn = torch.cat([pmask.index_select(0, rows), batch.response_mask.to(pmask.dtype)], dim=1)  # [B, P + R]
    pos = pmask.sum(-1).index_select(0, rows)[:, None] + torch.arange(R, device=pmask.device)  # [B, R]
    out_r = decoder(input_ids=batch.response_ids, attention_mask=attn, position_ids=pos, use_cache=True,
                    **{name: cache})
    last = out.last_hidden_state[:, -1:, :].index_select(0, rows)  # [B, 1, H] predicts the first response token
    return torch.cat([last, out_r.last_hidden_state[:, : R - 1, :]], dim=1)


def logit_transform(model: torch.nn.Module) -> tuple[float, float | None]:
    """(scale, softcap) that the model applies to its logits after the output layer: Granite divides by
    config.logits_scaling (HyperCLOVA X multiplies by it), Cohere multiplies by config.logit_scale, Falcon-H1
    by config.lm_head_multiplier, Gemma 2/3 soft-cap at
    config.final_logit_softcapping. (1.0, None) for most models (Llama, Qwen, SmolLM)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(base, "config", None)
    cfg = getattr(cfg, "text_config", None) or cfg
    scale = 1.0
    if getattr(cfg, "logits_scaling", None):
        if getattr(cfg, "model_type", "") == "hyperclovax":  # HyperCLOVA X multiplies where Granite divides
            scale *= float(cfg.logits_scaling)
        else:
            scale /= float(cfg.logits_scaling)
    if getattr(cfg, "logit_scale", None):
        scale *= float(cfg.logit_scale)
    if getattr(cfg, "lm_head_multiplier", None):  # Falcon-H1
        scale *= float(cfg.lm_head_multiplier)
    cap = getattr(cfg, "final_logit_softcapping", None)
    return scale, float(cap) if cap else None


def apply_logit_transform(logits: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    if scale != 1.0:
        logits = logits * scale
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def _head_chunk(h: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, want_entropy: bool, scale: float = 1.0,
                softcap: float | None = None, head: torch.nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    # a wrapped output layer (LoRA on lm_head) runs as a module: its weight attribute is the frozen base's alone
    z = head(h) if head is not None else torch.nn.functional.linear(h, weight, bias)
    logits = apply_logit_transform(z.float(), scale, softcap)
    logits = logits / temperature  # [n, V]
    logz = torch.logsumexp(logits, dim=-1)  # [n]
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz  # [n]
    if want_entropy:
        probs = torch.softmax(logits, dim=-1)
        ent = logz - (probs * logits).sum(-1)  # [n]
    else:
        ent = torch.zeros_like(logp)
    return logp, ent


def _decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder() or base.model, base.get_output_embeddings()  # 4.56.0-1's get_decoder() gave None


def response_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch | SharedPromptBatch,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    want_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(response token | prefix) / T-scaled, and optionally the entropy, per response token.

    Returns (logp [B, R], entropy [B, R]); both 0 where response_mask is 0.
    """
    decoder, head = _decoder_and_head(model)
    if isinstance(batch, SharedPromptBatch):
        h = _shared_hidden(decoder, batch)  # [B, R, H]
    else:
        out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
        hidden = out.last_hidden_state  # [B, P+R, H]
        P = batch.prompt_len
        R = batch.response_ids.shape[1]
        h = hidden[:, P - 1 : P - 1 + R, :]  # [B, R, H] states that predict each response token
    sel = batch.response_mask.bool()  # [B, R]
    h_flat = h[sel]  # [N, H]
    t_flat = batch.response_ids[sel]  # [N]
    # a plain Linear head is applied from its weight; anything else (peft's LoRA wrapper of lm_head, whose
    # .weight is the base layer's without the adapter) runs its own forward
    plain = isinstance(head, torch.nn.Linear) and not hasattr(head, "base_layer")
    weight, bias = (head.weight, getattr(head, "bias", None)) if plain else (None, None)
    scale, softcap = logit_transform(model)
    logps, ents = [], []
    for s in range(0, h_flat.shape[0], chunk_tokens):
        args = (h_flat[s : s + chunk_tokens], weight, bias, t_flat[s : s + chunk_tokens], temperature, want_entropy,
                scale, softcap, None if plain else head)
        if torch.is_grad_enabled():
            lp, en = checkpoint(_head_chunk, *args, use_reentrant=False)
        else:
            lp, en = _head_chunk(*args)
        logps.append(lp)
        ents.append(en)
    logp = torch.zeros(sel.shape, dtype=torch.float32, device=sel.device)
    ent = torch.zeros(sel.shape, dtype=torch.float32, device=sel.device)
    if logps:
        logp = logp.masked_scatter(sel, torch.cat(logps))
        ent = ent.masked_scatter(sel, torch.cat(ents))
    return logp, ent
