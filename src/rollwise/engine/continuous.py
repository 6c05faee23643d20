"""The continuous-batching engine: a slot scheduler over one batched KV cache.

Up to `num_slots` sequences decode together. When one finishes, waiting requests are
prefilled (several in one forward) and their KV rows spliced into the batch cache, all rows
left-aligned to one length: the shorter side is left-padded with zero KV that the per-row
attention mask hides, and leading columns that are padding for every row are trimmed as
rows leave. A round can stop early (`stop_when`, `token_budget`); in-flight sequences then
come back as resumable requests carrying their tokens, log-probs and versions as a prefix.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F

from rollwise.engine.hf import GenerationOutput, GenerationRequest, HFEngine, _filter_logits
from rollwise.types import FinishReason

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [S, heads, T, d]


def _get_kv(cache: Any) -> KV:
    """Per-layer tensors of a transformers cache, old (key_cache lists) or new (layers) layout."""
    if hasattr(cache, "layers"):
        if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
            raise ValueError("continuous engine: models with sliding-window attention caches are not supported; use the hf engine")
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _set_kv(cache: Any, kv: KV) -> None:
    if hasattr(cache, "layers"):
        for layer, (k, v) in zip(cache.layers, kv):
            layer.keys, layer.values = k, v
    else:
        cache.key_cache[:] = [k for k, _ in kv]
        cache.value_cache[:] = [v for _, v in kv]
    if hasattr(cache, "_seen_tokens"):  # old DynamicCache tracked its length separately
        cache._seen_tokens = kv[0][0].shape[-2]


def _lpad(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    """Left-pad `x` with n zeros along dim -1 (masks [S, T]) or -2 (KV [S, h, T, d])."""
    if n <= 0:
        return x
    return F.pad(x, (n, 0) if dim == -1 else (0, 0, n, 0))


@dataclass
class _Row:
    """One sequence in flight: `tokens` is the whole response so far (resumed prefix included)."""

    req: GenerationRequest
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: FinishReason | None = None

    @classmethod
    def start(cls, req: GenerationRequest, eos: set[int]) -> _Row:
        if not (len(req.prefix_ids) == len(req.prefix_logprobs) == len(req.prefix_versions)):
            raise ValueError("prefix_ids, prefix_logprobs and prefix_versions must have the same length")
        if not req.prompt_ids and not req.prefix_ids:
            raise ValueError("a request needs a non-empty prompt or prefix")
        row = cls(req, list(req.prefix_ids), list(req.prefix_logprobs), list(req.prefix_versions))
        row.check(eos)
        return row

    def check(self, eos: set[int]) -> None:
        if self.tokens and self.tokens[-1] in eos:
            self.finish = "stop"
        elif len(self.tokens) >= self.req.max_new_tokens:
            self.finish = "length"

    def output(self) -> GenerationOutput:
        assert self.finish is not None
        return GenerationOutput(self.tokens, self.logprobs, self.versions, self.finish, self.req.request_id)

    def resumable(self) -> GenerationRequest:
        return replace(self.req, prefix_ids=self.tokens, prefix_logprobs=self.logprobs, prefix_versions=self.versions)


class _SlotBatch:
    """The rows in flight, their batch cache and the attention mask over its columns."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.cache: Any = None
        self.attn: torch.Tensor | None = None  # [S, T] 1 on real context tokens

    def add(self, cache: Any, attn: torch.Tensor, rows: list[_Row]) -> None:
        """Splice prefilled rows (cache [n, h, L, d], attn [n, L]) in, left-aligning both sides."""
        if self.attn is None:
            self.cache, self.attn, self.rows = cache, attn, list(rows)
            return
        T, L = self.attn.shape[1], attn.shape[1]
        merged = [(torch.cat([_lpad(ko, L - T, -2), _lpad(kn, T - L, -2)]),
                   torch.cat([_lpad(vo, L - T, -2), _lpad(vn, T - L, -2)]))
                  for (ko, vo), (kn, vn) in zip(_get_kv(self.cache), _get_kv(cache))]  # [S+n, h, max(T, L), d]
        _set_kv(self.cache, merged)
        self.attn = torch.cat([_lpad(self.attn, L - T, -1), _lpad(attn, T - L, -1)])
        self.rows += rows

    def drop_finished(self) -> list[_Row]:
        """Remove finished rows, then trim leading columns that are padding for every remaining row."""
        done = [r for r in self.rows if r.finish is not None]
        if not done:
            return []
        keep = [i for i, r in enumerate(self.rows) if r.finish is None]
        if not keep:
            self.rows, self.cache, self.attn = [], None, None
            return done
        assert self.attn is not None
        sel = torch.tensor(keep, device=self.attn.device)
        attn = self.attn[sel]  # [S', T]
        lead = int(attn.any(0).int().argmax())  # first column some row attends to
        _set_kv(self.cache, [(k[sel, :, lead:], v[sel, :, lead:]) for k, v in _get_kv(self.cache)])
        self.attn = attn[:, lead:]
        self.rows = [self.rows[i] for i in keep]
        return done


class ContinuousEngine(HFEngine):
    """Drop-in for HFEngine with continuous batching; `batch_size` caps how many prompts prefill together."""

    def __init__(self, model: torch.nn.Module, eos_token_ids: list[int], pad_token_id: int,
                 dtype: torch.dtype = torch.bfloat16, batch_size: int = 64, top_p: float = 1.0, top_k: int = 0,
                 seed: int = 0, num_slots: int | None = None):
        super().__init__(model, eos_token_ids, pad_token_id, dtype, batch_size, top_p, top_k, seed)
        self.num_slots = num_slots or batch_size
        self.device = next(self.model.parameters()).device
        self.stats: dict[str, float] = dict.fromkeys(
            ("prefill_calls", "prefill_s", "decode_calls", "decode_tokens", "decode_s"), 0.0)

    def generate(self, requests: list[GenerationRequest], generator: torch.Generator | None = None
                 ) -> list[GenerationOutput]:
        """Generate every request to completion; outputs in request order."""
        keyed = [replace(r, request_id=i) for i, r in enumerate(requests)]
        finished, unfinished = self.run_round(keyed, generator=generator)
        assert not unfinished
        out = sorted(finished, key=lambda o: o.request_id or 0)
        for o, r in zip(out, requests):
            o.request_id = r.request_id
        return out

    @torch.no_grad()
    def run_round(self, requests: list[GenerationRequest],
                  stop_when: Callable[[list[GenerationOutput]], bool] | None = None,
                  token_budget: int | None = None, generator: torch.Generator | None = None,
                  ) -> tuple[list[GenerationOutput], list[GenerationRequest]]:
        """Run requests (FIFO) with the slots kept full until all finish, `stop_when(finished)` is
        True, or `token_budget` new tokens were generated this round.

        Returns (finished outputs in finish order, unfinished requests): sequences in flight come
        back as resumable requests (prefix = their response so far), then the never-started ones
        as given. A missing `request_id` is filled with the request's index in `requests`; give
        ids yourself when a round mixes resumed and new requests."""
        gen = generator if generator is not None else self.generator
        waiting = deque(r if r.request_id is not None else replace(r, request_id=i) for i, r in enumerate(requests))
        finished: list[GenerationOutput] = []
        batch = _SlotBatch()
        produced, seen = 0, -1
        while batch.rows or waiting:
            if token_budget is not None and produced >= token_budget:
                break
            if stop_when is not None and len(finished) != seen:
                seen = len(finished)
                if stop_when(finished):
                    break
            t0 = time.perf_counter()
            free = self.num_slots - len(batch.rows)
            if free > 0 and waiting:
                rows: list[_Row] = []
                while waiting and len(rows) < min(free, self.batch_size):
                    row = _Row.start(waiting.popleft(), self.eos)
                    if row.finish:  # a resumed prefix that is already complete
                        finished.append(row.output())
                    else:
                        rows.append(row)
                if not rows:
                    continue
                logits = self._prefill(batch, rows)
                produced += self._sample(rows, logits, gen)
                self.stats["prefill_calls"] += 1
                self.stats["prefill_s"] += time.perf_counter() - t0
            else:
                rows = batch.rows
                produced += self._sample(rows, self._decode(batch), gen)
                self.stats["decode_calls"] += 1
                self.stats["decode_tokens"] += len(rows)
                self.stats["decode_s"] += time.perf_counter() - t0
            finished += [r.output() for r in batch.drop_finished()]
        return finished, [r.resumable() for r in batch.rows] + list(waiting)

    def _forward(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        kwargs = {self._cache_arg: cache} if cache is not None else {}
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                         **kwargs)
        return out.logits[:, -1, :], getattr(out, self._cache_arg)  # [S, V]

    def _prefill(self, batch: _SlotBatch, rows: list[_Row]) -> torch.Tensor:
        """One forward over the new rows' contexts (prompt + prefix), left-padded; splices their KV in."""
        ctx = [r.req.prompt_ids + r.tokens for r in rows]
        L = max(len(c) for c in ctx)
        ids = torch.full((len(rows), L), self.pad, dtype=torch.long)  # [n, L]
        attn = torch.zeros((len(rows), L), dtype=torch.long)  # [n, L]
        for b, c in enumerate(ctx):
            ids[b, L - len(c):] = torch.tensor(c, dtype=torch.long)
            attn[b, L - len(c):] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [n, L]
        logits, cache = self._forward(ids, attn, pos, None)
        batch.add(cache, attn, rows)
        return logits

    def _decode(self, batch: _SlotBatch) -> torch.Tensor:
        """One step for every row: feed each row's last sampled token."""
        assert batch.attn is not None
        S = len(batch.rows)
        ids = torch.tensor([[r.tokens[-1]] for r in batch.rows], dtype=torch.long, device=self.device)  # [S, 1]
        pos = batch.attn.sum(-1, keepdim=True)  # [S, 1] real tokens so far = next position
        attn = torch.cat([batch.attn, torch.ones((S, 1), dtype=batch.attn.dtype, device=self.device)], 1)  # [S, T+1]
        logits, batch.cache = self._forward(ids, attn, pos, batch.cache)
        batch.attn = attn
        return logits

    def _sample(self, rows: list[_Row], logits: torch.Tensor, gen: torch.Generator) -> int:
        """Pick each row's next token from logits [n, V]; record log-prob and version; mark finished rows."""
        temps = torch.tensor([max(r.req.temperature, 1e-6) for r in rows], device=logits.device).unsqueeze(1)
        logits = logits.float() / temps  # [n, V]
        logprobs_full = torch.log_softmax(logits, dim=-1)  # [n, V]
        greedy = torch.tensor([r.req.greedy for r in rows], device=logits.device)  # [n]
        nxt = logits.argmax(-1)  # [n]
        if not bool(greedy.all()):
            probs = _filter_logits(logits, self.top_k, self.top_p).softmax(-1).to(gen.device)
            sampled = torch.multinomial(probs, 1, generator=gen).squeeze(1).to(logits.device)  # [n]
            nxt = torch.where(greedy, nxt, sampled)
        lps = logprobs_full.gather(1, nxt.unsqueeze(1)).squeeze(1)  # [n]
        for r, t, lp in zip(rows, nxt.tolist(), lps.tolist()):
            r.tokens.append(t)
            r.logprobs.append(lp)
            r.versions.append(self.version)
            r.check(self.eos)
        return len(rows)


def peak_decode_throughput(engine: ContinuousEngine, prompt_ids: list[int], num_slots: int, new_tokens: int) -> float:
    """Decode tokens/s with every slot busy: `num_slots` copies of the prompt, EOS ignored, sampled
    at T=1 with a private RNG (the engine's own is untouched). Prefill time is excluded."""
    saved = engine.eos, engine.num_slots
    engine.eos, engine.num_slots = set(), num_slots
    try:
        engine.generate([GenerationRequest(list(prompt_ids), 2)], generator=torch.Generator().manual_seed(0))  # warm-up
        tokens, secs = engine.stats["decode_tokens"], engine.stats["decode_s"]
        reqs = [GenerationRequest(list(prompt_ids), new_tokens) for _ in range(num_slots)]
        engine.generate(reqs, generator=torch.Generator().manual_seed(0))
        tokens, secs = engine.stats["decode_tokens"] - tokens, engine.stats["decode_s"] - secs
    finally:
        engine.eos, engine.num_slots = saved
    return tokens / max(secs, 1e-9)
