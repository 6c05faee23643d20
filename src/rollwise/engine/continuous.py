"""The continuous-batching engine: a slot scheduler over one preallocated KV cache.

Up to `num_slots` sequences decode together. Every layer's keys and values live in buffers
[num_slots, heads, capacity, head_dim] that are written in place: all active rows share one
write column, the rows are left-padded (a per-row attention mask hides the padding) and
occupy slots 0..B-1. A finished row is replaced by the last active row (one row copied), and
waiting requests are prefilled and written into the free slots, so the decode batch stays
full without the per-step cache copy of a growing `DynamicCache`. Prompts are prefilled once
per weight version: the KV of a prompt is kept (LRU) and copied for each of its samples.

A round can stop early (`stop_when`, `token_budget`); in-flight sequences then come back as
resumable requests carrying their tokens, log-probs and versions as a prefix.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from rollwise.algos.speculative import old_distribution_from_topk, residual_distribution, speculative_accept
from rollwise.config import ConfigError
from rollwise.engine.hf import (
    GenerationOutput,
    GenerationRequest,
    HFEngine,
    RoundFeed,
    RoundStop,
    _filter_logits,
    draw,
    is_greedy,
)
from rollwise.types import FinishReason

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [n, heads, T, d]


def _get_kv(cache: Any) -> KV:
    """Per-layer tensors of a transformers cache."""
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        raise ConfigError("rollout.engine=continuous does not support models with sliding-window attention "
                          "(this model.name_or_path has some); set rollout.engine=hf")
    return [(layer.keys, layer.values) for layer in cache.layers]


class _SlotLayer(DynamicLayer):
    """One layer's cache as views into preallocated buffers; `update` writes at column `n` of rows 0..B-1."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor):
        super().__init__()
        self.kbuf, self.vbuf = kbuf, vbuf  # [S, h, cap, d]
        self.B, self.n = 0, 0
        self.is_initialized = True
        self.device, self.dtype = kbuf.device, kbuf.dtype
        self.view()

    def view(self) -> None:
        self.keys = self.kbuf[: self.B, :, : self.n]
        self.values = self.vbuf[: self.B, :, : self.n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        q = key_states.shape[-2]
        self.kbuf[: self.B, :, self.n : self.n + q] = key_states
        self.vbuf[: self.B, :, self.n : self.n + q] = value_states
        self.n += q
        self.view()
        return self.keys, self.values

    def get_seq_length(self, *args: Any) -> int:
        return self.n


def _check_prefix(req: GenerationRequest) -> None:
    if not (len(req.prefix_ids) == len(req.prefix_logprobs) == len(req.prefix_versions)):
        raise ValueError("prefix_ids, prefix_logprobs and prefix_versions must have the same length")
    if not req.prompt_ids and not req.prefix_ids:
        raise ValueError("a request needs a non-empty prompt or prefix")


@dataclass
class _Row:
    """One sequence in flight: `tokens` is the whole response so far (resumed prefix included)."""

    req: GenerationRequest
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    # per token of `tokens`; None when the row cannot have one per token (a resumed prefix came without its
    # top-k): entry i must describe token i, so the row then records none and its output has none
    topk: list[tuple[torch.Tensor, torch.Tensor]] | None = field(default_factory=list)

    @classmethod
    def start(cls, req: GenerationRequest, eos: set[int]) -> _Row:
        _check_prefix(req)
        topk = unpack_topk(req.prefix_topk)
        row = cls(req, list(req.prefix_ids), list(req.prefix_logprobs), list(req.prefix_versions),
                  topk=topk if len(topk) == len(req.prefix_ids) else None)
        row.check(eos)
        return row

    @property
    def context(self) -> tuple[int, ...]:
        return tuple(self.req.prompt_ids) + tuple(self.tokens)

    def check(self, eos: set[int]) -> None:
        if self.tokens and self.tokens[-1] in eos:
            self.finish = "stop"
        elif len(self.tokens) >= self.req.max_new_tokens:
            self.finish = "length"

    def output(self) -> GenerationOutput:
        assert self.finish is not None
        return GenerationOutput(self.tokens, self.logprobs, self.versions, self.finish, self.req.request_id,
                                pack_topk(self.topk) if self.topk is not None else [])

    def resumable(self) -> GenerationRequest:
        return replace(self.req, prefix_ids=list(self.tokens), prefix_logprobs=list(self.logprobs),
                       prefix_versions=list(self.versions), prefix_topk=list(self.topk or []))


def pack_topk(topk: Any) -> Any:
    """A finished response's per-token top-k as (ids [L, K] int32, probs [L, K] fp16) on the CPU: a
    response banked for speculative reuse keeps two tensors, not two per token (views that also kept
    each decode step's whole [rows, K] storage alive)."""
    if not topk or isinstance(topk, tuple):
        return topk
    return torch.stack([i for i, _ in topk]).cpu(), torch.stack([p for _, p in topk]).cpu()


def unpack_topk(topk: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per token (ids [K], probs [K]), from either form."""
    return list(zip(topk[0], topk[1])) if isinstance(topk, tuple) else list(topk)


def topk_at(topk: Any, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Token n's (ids [K], probs [K]) from either form; None where none was recorded."""
    if isinstance(topk, tuple):
        return (topk[0][n], topk[1][n]) if topk[0].shape[0] > n else None
    return topk[n] if len(topk) > n else None


class _Slots:
    """Rows in flight (slots 0..B-1), their KV buffers, attention mask [S, cap] and next positions [S]."""

    def __init__(self, num_slots: int) -> None:
        self.S = num_slots
        self.rows: list[_Row] = []
        self.layers: list[_SlotLayer] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [S, cap] 1 on real context columns
        self.pos: torch.Tensor | None = None  # [S] position id of each row's next token
        self.n = 0  # columns in use (shared write column)
        self.relayouts = 0

    @property
    def B(self) -> int:
        return len(self.rows)

    @property
    def cap(self) -> int:
        return self.layers[0].kbuf.shape[2] if self.layers else 0

    def _alloc(self, like: KV | None, cap: int) -> None:
        """Fresh buffers with `cap` columns (shaped after `like` or the current ones); columns [0, n) of active rows are kept."""
        shapes = like if like is not None else [(layer.kbuf, layer.vbuf) for layer in self.layers]
        new = [_SlotLayer(k.new_zeros((self.S, k.shape[-3], cap, k.shape[-1])), v.new_zeros((self.S, v.shape[-3], cap, v.shape[-1])))
               for k, v in shapes]
        mask = torch.zeros((self.S, cap), dtype=torch.long, device=shapes[0][0].device)
        if self.layers and self.B:
            assert self.mask is not None
            for old, nl in zip(self.layers, new):
                nl.kbuf[: self.B, :, : self.n] = old.kbuf[: self.B, :, : self.n]
                nl.vbuf[: self.B, :, : self.n] = old.vbuf[: self.B, :, : self.n]
            mask[: self.B, : self.n] = self.mask[: self.B, : self.n]
        self.layers, self.mask = new, mask
        if self.pos is None:
            self.pos = torch.zeros(self.S, dtype=torch.long, device=mask.device)
        self.cache = DynamicCache()
        self.cache.layers = list(new)

    def _shift(self, lead: int, new_n: int) -> None:
        """Move the live columns [lead, n) of active rows so that they end at column new_n; n = new_n."""
        live = self.n - lead
        if self.B and new_n - live != lead:
            assert self.mask is not None
            for layer in self.layers:
                for buf in (layer.kbuf, layer.vbuf):
                    buf[: self.B, :, new_n - live : new_n] = buf[: self.B, :, lead : self.n].clone()
            m = self.mask[: self.B, lead : self.n].clone()
            self.mask[: self.B].zero_()
            self.mask[: self.B, new_n - live : new_n] = m
            self.relayouts += 1
        self.n = new_n

    def make_room(self, like: KV | None, need_n: int, headroom: int) -> None:
        """Ensure n >= need_n and n + 1 <= cap: trim leading all-padding columns, grow the buffers if needed."""
        if not self.B:
            self.n = 0
        if self.layers and need_n <= self.n and self.n + 1 <= self.cap:
            return
        lead = 0
        if self.B:
            assert self.mask is not None
            lead = int(self.mask[: self.B, : self.n].any(0).int().argmax())  # first column some row attends to
        live = self.n - lead
        new_n = max(live, need_n)
        if not self.layers or new_n + 1 > self.cap:
            self._shift(lead, live)  # live columns to [0, live), then into bigger buffers
            lead = 0
            self._alloc(like, new_n + 1 + headroom)
        self._shift(lead, new_n)

    def admit(self, kvs: list[list[tuple[torch.Tensor, torch.Tensor]]], rows: list[_Row], headroom: int) -> None:
        """Write each new row's prefilled context (per layer k, v [h, L_j, d]) into the next free slot."""
        lengths = [kv[0][0].shape[-2] for kv in kvs]
        self.make_room(kvs[0], max(lengths), headroom)
        assert self.mask is not None and self.pos is not None
        b0 = self.B
        for j, (kv, L) in enumerate(zip(kvs, lengths)):
            for layer, (k, v) in zip(self.layers, kv):
                layer.kbuf[b0 + j, :, self.n - L : self.n] = k
                layer.vbuf[b0 + j, :, self.n - L : self.n] = v
            self.mask[b0 + j] = 0
            self.mask[b0 + j, self.n - L : self.n] = 1
            self.pos[b0 + j] = L
        self.rows += rows

    def remove_finished(self) -> list[_Row]:
        """Drop finished rows; the last active row moves into each freed slot."""
        return self.remove(lambda r: r.finish is not None)

    def remove(self, drop: Callable[[_Row], bool]) -> list[_Row]:
        """Drop the rows `drop` selects; the last active row moves into each freed slot."""
        done = [r for r in self.rows if drop(r)]
        if not done:
            return []
        assert self.mask is not None and self.pos is not None
        i = 0
        while i < len(self.rows):
            if not drop(self.rows[i]):
                i += 1
                continue
            last = len(self.rows) - 1
            if i != last:
                for layer in self.layers:
                    layer.kbuf[i, :, : self.n] = layer.kbuf[last, :, : self.n]
                    layer.vbuf[i, :, : self.n] = layer.vbuf[last, :, : self.n]
                self.mask[i, : self.n] = self.mask[last, : self.n]
                self.pos[i] = self.pos[last]
                self.rows[i] = self.rows[last]
            self.rows.pop()
        return done

    def decode_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids [B, 1], attention mask [B, n+1], positions [B, 1]) for one decode step; call `advance` after."""
        assert self.mask is not None and self.pos is not None
        B = self.B
        self.mask[:B, self.n] = 1
        self.sync_layers()
        ids = torch.tensor([[r.tokens[-1]] for r in self.rows], dtype=torch.long, device=self.mask.device)
        return ids, self.mask[:B, : self.n + 1], self.pos[:B].unsqueeze(1)

    def sync_layers(self) -> None:
        for layer in self.layers:
            layer.B, layer.n = self.B, self.n
            layer.view()

    def advance(self) -> None:
        assert self.pos is not None
        self.n += 1
        self.pos[: self.B] += 1


_Entry = tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]  # per-layer (k, v) [h, L, d]; last logits [V]


class ContinuousEngine(HFEngine):
    """Drop-in for HFEngine with continuous batching.

    `num_slots` rows decode together; `batch_size` caps how many contexts prefill in one
    forward; `prefix_cache` is how many prompts keep their prefilled KV (0 turns it off); a
    resumed request prefills only its prefix on top of its prompt's KV. `record_topk` > 0
    keeps, for every sampled token, the top-k of its distribution (speculative reuse)."""

    accepts_feed = True  # run_round(feed=...): follow-up requests join a running round

    def __init__(self, model: torch.nn.Module, eos_token_ids: list[int], pad_token_id: int,
                 dtype: torch.dtype = torch.bfloat16, batch_size: int = 64, top_p: float = 1.0, top_k: int = 0,
                 seed: int = 0, num_slots: int | None = None, prefix_cache: int = 64, record_topk: int = 0,
                 transpose_weights: bool | None = None):
        super().__init__(model, eos_token_ids, pad_token_id, dtype, batch_size, top_p, top_k, seed, transpose_weights)
        self.num_slots = num_slots or batch_size
        self.prefix_cache = prefix_cache
        self.record_topk = record_topk
        self.device = next(self.model.parameters()).device
        self._held: _Slots | None = None  # rows kept in flight by run_round(hold=True)
        self._prefix: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self.stats: dict[str, float] = dict.fromkeys(
            ("prefill_calls", "prefill_tokens", "prefix_hits", "prefill_s", "decode_calls", "decode_tokens", "decode_s",
             "sampled_tokens", "spec_candidates", "spec_old_tokens", "spec_accepted_tokens", "spec_full_reuse",
             "spec_no_topk", "spec_verify_s"),
            0.0)

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        super().load_weights(state_dict, version)
        self._prefix.clear()  # prefilled KV belongs to the old weights

    @contextmanager
    def held_aside(self) -> Iterator[None]:
        """Rows held for a later round (run_round(hold=True)) stay out of the rounds run inside, and are
        held again afterwards: an evaluation, or a follow-up round of the same step."""
        held, self._held = self._held, None
        try:
            yield
        finally:
            self._held = held

    def drop_held(self) -> None:
        """Forget the sequences held by run_round(hold=True); a later round prefills them again."""
        self._held = None

    def generate(self, requests: list[GenerationRequest], generator: torch.Generator | None = None
                 ) -> list[GenerationOutput]:
        """Generate every request to completion; outputs in request order."""
        keyed = [replace(r, request_id=i) for i, r in enumerate(requests)]
        with self.held_aside():
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
                  hold: bool = False,
                  feed: Callable[[list[GenerationOutput]], list[GenerationRequest]] | None = None,
                  ) -> tuple[list[GenerationOutput], list[GenerationRequest]]:
        """Run requests (FIFO) with the slots kept full until all finish, `stop_when(finished)` is
        True, or `token_budget` new tokens were generated this round.

        Returns (finished outputs in finish order, unfinished requests): sequences in flight come
        back as resumable requests (prefix = their response so far), then the never-started ones
        as given. A missing `request_id` is filled with the request's index in `requests`; give
        ids yourself when a round mixes resumed and new requests.

        `hold=True` keeps the sequences in flight, KV cache included, inside the engine: a later
        round given the same resumable request (same id and prefix length) continues it in its
        slot instead of prefilling prompt + prefix again, even after `load_weights` (the kept
        keys and values then come from the older weights: PipelineRL's in-flight update). Held
        rows that the next round does not ask for are dropped.

        `feed(newly_finished)` is called whenever sequences have finished; the requests it returns
        (each with its own `request_id`) join the queue of this round, so follow-up work decided
        from finished outputs fills slots that would otherwise wait for the round's slowest
        sequence."""
        gen = generator if generator is not None else self.generator
        requests = [r if r.request_id is not None else replace(r, request_id=i) for i, r in enumerate(requests)]
        slots, self._held = self._held or _Slots(self.num_slots), None
        if slots.B:
            want = {r.request_id: len(r.prefix_ids) for r in requests}
            slots.remove(lambda row: want.get(row.req.request_id) != len(row.tokens))
        in_slots = {row.req.request_id for row in slots.rows}
        waiting = deque(r for r in requests if r.request_id not in in_slots)
        headroom = max((r.max_new_tokens for r in requests), default=0)
        finished: list[GenerationOutput] = []
        produced, stop, follow = 0, RoundStop(stop_when, token_budget), RoundFeed(feed)
        while True:
            for r in follow(finished):
                waiting.append(r)
                headroom = max(headroom, r.max_new_tokens)
            if not (slots.B or waiting) or stop(produced, finished):
                break
            t0 = time.perf_counter()
            free = self.num_slots - slots.B
            if free > 0 and waiting:
                rows: list[_Row] = []
                while waiting and len(rows) < min(free, self.batch_size):
                    row = _Row.start(waiting.popleft(), self.eos)
                    self.check_token_ids(row.context, "a request's prompt or resumed prefix")
                    if row.finish:  # a resumed prefix that is already complete
                        finished.append(row.output())
                    else:
                        rows.append(row)
                if rows:
                    entries = self._prefill(rows)
                    slots.admit([e[0] for e in entries], rows, headroom)
                    produced += self._sample(rows, torch.stack([e[1] for e in entries]), gen)
                    self.stats["prefill_s"] += time.perf_counter() - t0
                    finished += [r.output() for r in slots.remove_finished()]
                continue
            slots.make_room(None, 0, headroom)
            ids, attn, pos = slots.decode_inputs()
            logits, _ = self._forward(ids, attn, pos, slots.cache)
            slots.advance()
            produced += self._sample(slots.rows, logits, gen)
            self.stats["decode_calls"] += 1
            self.stats["decode_tokens"] += slots.B
            self.stats["decode_s"] += time.perf_counter() - t0
            finished += [r.output() for r in slots.remove_finished()]
        if hold and slots.rows:
            self._held = slots
        return finished, [r.resumable() for r in slots.rows] + list(waiting)

    def _forward(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        kwargs = {self._cache_arg: cache} if cache is not None else {}
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1,
                         **kwargs)
        return out.logits[:, -1, :], getattr(out, self._cache_arg)  # [n, V]

    def _prefill(self, rows: list[_Row]) -> list[_Entry]:
        """KV and last logits of each row's context (prompt + prefix). Prompts not in the prefix
        cache run in one forward, each once however many rows share it; the prefixes of resumed
        rows then run in a second forward on top of their prompt's KV."""
        ctxs = [r.context for r in rows]
        # the cached entries this round reads, taken before remembering new prompts can evict them
        known = {k: self._prefix[k] for k in {*ctxs, *(tuple(r.req.prompt_ids) for r in rows)} if k in self._prefix}
        bases = {tuple(r.req.prompt_ids) if r.req.prompt_ids else c for r, c in zip(rows, ctxs) if c not in known}
        todo = [b for b in bases if b not in known]
        fresh: dict[tuple[int, ...], _Entry] = {}
        if todo:
            L = max(len(c) for c in todo)
            ids = torch.full((len(todo), L), self.pad, dtype=torch.long)  # [u, L] left-padded
            attn = torch.zeros((len(todo), L), dtype=torch.long)  # [u, L]
            for b, c in enumerate(todo):
                ids[b, L - len(c):] = torch.tensor(c, dtype=torch.long)
                attn[b, L - len(c):] = 1
            ids, attn = ids.to(self.device), attn.to(self.device)
            pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [u, L]
            logits, cache = self._forward(ids, attn, pos, None)
            kv = _get_kv(cache)
            prompts = {tuple(r.req.prompt_ids) for r in rows}
            for b, c in enumerate(todo):
                fresh[c] = ([(k[b, :, L - len(c):].clone(), v[b, :, L - len(c):].clone()) for k, v in kv],
                            logits[b].clone())
                if self.prefix_cache > 0 and c in prompts:
                    self._remember(c, fresh[c])
            self.stats["prefill_calls"] += 1
            self.stats["prefill_tokens"] += int(attn.sum())
        resumed = [(r, c) for r, c in zip(rows, ctxs) if c not in fresh and c not in known]
        if resumed:  # prefix on top of the prompt's KV
            base = [fresh.get(tuple(r.req.prompt_ids)) or known[tuple(r.req.prompt_ids)] for r, _ in resumed]
            kvs, hidden = self._extend(base, [r.tokens for r, _ in resumed])
            last = torch.stack([hidden[j, len(r.tokens) - 1] for j, (r, _) in enumerate(resumed)])  # [m, H]
            logits = self._head(last)  # [m, V]
            for j, (_, c) in enumerate(resumed):
                fresh[c] = (kvs[j], logits[j])
        out = []
        for c in ctxs:
            if c in fresh:
                out.append(fresh[c])
            else:
                if c in self._prefix:
                    self._prefix.move_to_end(c)
                out.append(known[c])
                self.stats["prefix_hits"] += 1
        return out

    def _remember(self, key: tuple[int, ...], entry: _Entry) -> None:
        self._prefix[key] = entry
        while len(self._prefix) > self.prefix_cache:
            self._prefix.popitem(last=False)

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output layer and what the model does to its logits after it (Granite's logits_scaling,
        Cohere's logit_scale, Gemma's soft cap), as its full forward does."""
        from rollwise.training.logprobs import apply_logit_transform, logit_transform

        return apply_logit_transform(self.model.get_output_embeddings()(hidden), *logit_transform(self.model))

    def _extend(self, bases: list[_Entry], suffixes: list[list[int]]) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], torch.Tensor]:
        """Run each suffix on top of its base context's KV in one forward.

        Returns, per row, the KV of base + suffix (per layer [h, L_base + q_j, d]) and the final
        hidden states over the suffix positions [u, q, H] (right-padded to the longest suffix)."""
        u, q = len(bases), max(len(x) for x in suffixes)
        tmp = _Slots(u)
        tmp.admit([b[0] for b in bases], [_Row(GenerationRequest([0], 1))] * u, headroom=q)
        assert tmp.mask is not None and tmp.pos is not None
        n = tmp.n
        ids = torch.full((u, q), self.pad, dtype=torch.long, device=self.device)
        for j, x in enumerate(suffixes):
            ids[j, : len(x)] = torch.tensor(x, dtype=torch.long)
            tmp.mask[j, n : n + len(x)] = 1
        pos = tmp.pos[:u, None] + torch.arange(q, device=self.device)  # [u, q]
        tmp.sync_layers()
        decoder = self.model.get_decoder()
        out = decoder(input_ids=ids, attention_mask=tmp.mask[:u, : n + q], position_ids=pos, use_cache=True,
                      **{self._cache_arg: tmp.cache})
        kvs = []
        for j, (b, x) in enumerate(zip(bases, suffixes)):
            L = b[0][0][0].shape[-2]
            kvs.append([(layer.kbuf[j, :, n - L : n + len(x)], layer.vbuf[j, :, n - L : n + len(x)]) for layer in tmp.layers])
        self.stats["prefill_calls"] += 1
        self.stats["prefill_tokens"] += sum(len(x) for x in suffixes)
        return kvs, out.last_hidden_state  # [u, q, H]

    @torch.no_grad()
    def verify(self, prompts: list[list[int]], olds: list[GenerationOutput], lenience: float, temperature: float,
               max_new_tokens: int, generator: torch.Generator | None = None,
               ) -> list[GenerationOutput | GenerationRequest]:
        """Speculative reuse (SPEC-RL): score each old response under the current weights and keep
        the prefix accepted token by token with probability min(1, lenience * p_new / p_old).

        At the first rejection a token is drawn from the residual max(0, p_new - min(p_old,
        lenience * p_new)), with p_old rebuilt from its stored top-k (`old_distribution_from_topk`;
        the full p_new is used where an old response has no top-k). Each item comes back complete (a
        GenerationOutput: fully accepted, or the resampled token ended it) or as a request to
        continue from the accepted prefix. Kept tokens carry the current weights' log-probs and
        version; their distribution is the current policy's (exactly so at lenience <= 1 with
        full top-k). Counts go to `stats` (spec_*)."""
        if any(not p for p in prompts):
            raise ValueError("verify: a prompt is empty; every prompt needs at least one token")
        for p in prompts:
            self.check_token_ids(p)
        gen = generator if generator is not None else self.generator
        out: list[GenerationOutput | GenerationRequest] = []
        t0 = time.perf_counter()
        step = max(1, self.batch_size // 4)
        for s0 in range(0, len(olds), step):
            chunk = list(range(s0, min(len(olds), s0 + step)))
            rows = [_Row(GenerationRequest(list(prompts[j]), 1)) for j in chunk]
            bases = self._prefill(rows)
            hidden = self._extend(bases, [olds[j].response_ids or [self.pad] for j in chunk])[1]  # [u, q, H]
            for c, j in enumerate(chunk):
                out.append(self._verify_one(prompts[j], olds[j], bases[c][1], hidden[c], lenience, temperature,
                                            max_new_tokens, gen))
        self.stats["spec_verify_s"] += time.perf_counter() - t0
        return out

    def _verify_one(self, prompt: list[int], old: GenerationOutput, first_logits: torch.Tensor, hidden: torch.Tensor,
                    lenience: float, temperature: float, max_new: int, gen: torch.Generator,
                    ) -> GenerationOutput | GenerationRequest:
        ids = old.response_ids[:max_new]
        L = len(ids)
        # logits for token i: the prompt's last position for i = 0, then the old response's positions
        logits = torch.cat([first_logits[None].float(), self._head(hidden[: max(L - 1, 0)]).float()])[:L]  # [L, V]
        logp_full = torch.log_softmax(logits / max(temperature, 1e-6), dim=-1)  # [L, V]
        dev = logp_full.device
        ids_t = torch.tensor(ids, dtype=torch.long, device=dev)
        new_lp = logp_full.gather(1, ids_t[:, None]).squeeze(1) if L else torch.zeros(0, device=dev)  # [L]
        old_lp = torch.tensor(old.logprobs[:L], dtype=torch.float64, device=dev)
        u = torch.rand(L, generator=gen, dtype=torch.float64, device=gen.device).to(dev)
        n = speculative_accept(new_lp.double(), old_lp, lenience, u) if L else 0
        K = self.record_topk
        topk: list[tuple[torch.Tensor, torch.Tensor]] = []
        if K:
            tp, ti = logp_full[: n + 1].topk(min(K, logp_full.shape[-1]), dim=-1)  # [n+1, K]
            topk = [(ti[i].int(), tp[i].exp().to(torch.float16)) for i in range(ti.shape[0])]
        tokens, lps = list(ids[:n]), new_lp[:n].tolist()
        self.stats["spec_candidates"] += 1
        self.stats["spec_old_tokens"] += L
        self.stats["spec_accepted_tokens"] += n
        if n < L:  # resample the first rejected position from the residual
            p_new = logp_full[n].exp()  # [V]
            recorded = topk_at(old.topk, n)
            if recorded is not None:
                p_old = old_distribution_from_topk(p_new, *recorded)
            else:
                p_old = p_new
                self.stats["spec_no_topk"] += 1
            t = int(draw(residual_distribution(p_new, p_old, lenience)[None], gen)[0])
            tokens.append(t)
            lps.append(float(logp_full[n, t]))
            self.stats["sampled_tokens"] += 1
        else:
            self.stats["spec_full_reuse"] += 1
        row = _Row(GenerationRequest(list(prompt), max_new, temperature), tokens, lps, [self.version] * len(tokens),
                   topk=topk[: len(tokens)])
        row.check(self.eos)
        if row.finish is not None:
            return row.output()
        return row.resumable()

    def _sample(self, rows: list[_Row], logits: torch.Tensor, gen: torch.Generator) -> int:
        """Pick each row's next token from logits [n, V]; record log-prob and version; mark finished rows."""
        temps = torch.tensor([max(r.req.temperature, 1e-6) for r in rows], device=logits.device).unsqueeze(1)
        logits = logits.float() / temps  # [n, V]
        logprobs_full = torch.log_softmax(logits, dim=-1)  # [n, V]
        greedy = torch.tensor([is_greedy(r.req) for r in rows], device=logits.device)  # [n]
        nxt = logits.argmax(-1)  # [n]
        if not bool(greedy.all()):
            probs = _filter_logits(logits, self.top_k, self.top_p).softmax(-1)
            sampled = draw(probs, gen)  # [n]; only the uniforms come from gen's device
            nxt = torch.where(greedy, nxt, sampled)
        lps = logprobs_full.gather(1, nxt.unsqueeze(1)).squeeze(1)  # [n]
        if self.record_topk:
            tp, ti = logprobs_full.topk(min(self.record_topk, logits.shape[-1]), dim=-1)  # [n, K]
            tp = tp.exp().to(torch.float16)
            for r, i, p in zip(rows, ti.int(), tp):
                if r.topk is not None:
                    r.topk.append((i, p))
        for r, t, lp in zip(rows, nxt.tolist(), lps.tolist()):
            r.tokens.append(t)
            r.logprobs.append(lp)
            r.versions.append(self.version)
            r.check(self.eos)
        self.stats["sampled_tokens"] += len(rows)
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
