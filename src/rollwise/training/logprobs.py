"""Per-token log-probs of response tokens, without materialising full-vocabulary logits
for the whole batch: the decoder runs once, the LM head and log-softmax run over chunks of
response tokens only (prompt positions never reach the LM head), and with gradients on
each chunk is recomputed in backward instead of keeping its [chunk, V] activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint


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


def _head_chunk(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, want_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.nn.functional.linear(h, weight, bias).float() / temperature  # [n, V]
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
    return base.get_decoder(), base.get_output_embeddings()


def response_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    want_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(response token | prefix) / T-scaled, and optionally the entropy, per response token.

    Returns (logp [B, R], entropy [B, R]); both 0 where response_mask is 0.
    """
    decoder, head = _decoder_and_head(model)
    out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    hidden = out.last_hidden_state  # [B, P+R, H]
    P = batch.prompt_len
    R = batch.response_ids.shape[1]
    h = hidden[:, P - 1 : P - 1 + R, :]  # [B, R, H] states that predict each response token
    sel = batch.response_mask.bool()  # [B, R]
    h_flat = h[sel]  # [N, H]
    t_flat = batch.response_ids[sel]  # [N]
    bias = getattr(head, "bias", None)
    logps, ents = [], []
    for s in range(0, h_flat.shape[0], chunk_tokens):
        args = (h_flat[s : s + chunk_tokens], head.weight, bias, t_flat[s : s + chunk_tokens], temperature, want_entropy)
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
