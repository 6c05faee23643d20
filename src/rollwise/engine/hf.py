"""The `hf` engine: batched sampling with a KV cache on any transformers causal LM.

It keeps its own copy of the policy in the compute dtype (bf16 by default: 1.5x faster
than fp32 on CPUs with avx512_bf16) and records, for every generated token, the behaviour
log-prob log softmax(logits / T)[token] and the policy version that produced it. On a CPU in
fp32 that copy stores its linear weights input-major (`transpose_linear_weights`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rollwise.models import cache_arg
from rollwise.types import FinishReason


@dataclass
class GenerationRequest:
    """One sequence to generate: prompt tokens plus sampling settings."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    greedy: bool = False  # argmax tokens; so does a temperature below GREEDY_BELOW_TEMPERATURE
    # A partial response to resume (continuous engine): part of the context, counted in max_new_tokens,
    # returned at the head of the output with its own log-probs and versions.
    prefix_ids: list[int] = field(default_factory=list)
    prefix_logprobs: list[float] = field(default_factory=list)
    prefix_versions: list[int] = field(default_factory=list)
    request_id: int | None = None
    # Top-k of the sampling distribution at each prefix token (ids, probs), when the engine records them.
    prefix_topk: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


@dataclass
class GenerationOutput:
    response_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    request_id: int | None = None
    # The top-k of the distribution each token was sampled from: per token (ids [K], probs [K]), or for a
    # finished response of the continuous engine packed as (ids [L, K] int32, probs [L, K] fp16) on the CPU
    # (two tensors a response, not two a token: bench/spec_bank_size.py); empty unless the engine's
    # `record_topk` > 0 (speculative reuse needs them to resample a rejected token).
    topk: Any = field(default_factory=list)


class RoundStop:
    """When an engine round ends early: `token_budget` new tokens produced, or `stop_when(finished)`
    true (asked only when `finished` has grown). Shared by every engine's run_round."""

    def __init__(self, stop_when: Callable[[list[GenerationOutput]], bool] | None, token_budget: int | None):
        self.stop_when, self.token_budget, self._seen = stop_when, token_budget, -1

    def __call__(self, produced: int, finished: list[GenerationOutput]) -> bool:
        if self.token_budget is not None and produced >= self.token_budget:
            return True
        if self.stop_when is not None and len(finished) != self._seen:
            self._seen = len(finished)
            return self.stop_when(finished)
        return False


class RoundFeed:
    """Follow-up requests for a running round: `feed(newly_finished)` is asked whenever `finished`
    has grown, each output once; what it returns needs its own request_id. Shared by every
    engine's run_round."""

    def __init__(self, feed: Callable[[list[GenerationOutput]], list[GenerationRequest]] | None):
        self.feed, self._fed = feed, 0

    def __call__(self, finished: list[GenerationOutput]) -> list[GenerationRequest]:
        if self.feed is None or len(finished) <= self._fed:
            return []
        more, self._fed = self.feed(finished[self._fed:]), len(finished)
        if any(r.request_id is None for r in more):
            raise ValueError("run_round(feed=...): requests returned by feed need a request_id")
        return more


# A temperature below this picks the most probable token, as `greedy` does (vLLM's _SAMPLING_EPS): sampling from
# logits / 1e-6 drew at random among tied top logits (frequent in bf16), so temperature 0 was not greedy.
GREEDY_BELOW_TEMPERATURE = 1e-5


def is_greedy(request: GenerationRequest) -> bool:
    """True when the request takes the argmax token: `greedy`, or a temperature of (about) 0."""
    return request.greedy or request.temperature < GREEDY_BELOW_TEMPERATURE


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside top-k / top-p (nucleus) with -inf.  logits: [B, V]."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True, dim=-1)  # [B, V]
        probs = sorted_logits.softmax(-1)
        # drop a token once the more probable ones hold top_p (HF's TopPLogitsWarper and vLLM do the same);
        # the token that crosses top_p is kept
        remove = probs.cumsum(-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, sorted_logits)
    return logits


def draw(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token per row of probs [n, V] by inverse CDF: a uniform per row against the cumulative
    sum. Same distribution as torch.multinomial(probs, 1), about 10x cheaper on CPU at V = 49k."""
    cdf = probs.float().cumsum(-1)  # [n, V]
    u = torch.rand((probs.shape[0], 1), generator=gen, device=gen.device).to(cdf.device) * cdf[:, -1:]  # [n, 1]
    idx = torch.searchsorted(cdf, u, right=True).squeeze(1)  # first index with cdf > u
    return idx.clamp(max=probs.shape[-1] - 1)


def transpose_linear_weights(model: torch.nn.Module) -> int:
    """Store each `nn.Linear` weight ([out, in]) as the transpose of a contiguous [in, out] tensor.

    Same values, same shape: only the memory order changes, so that y = x @ W.T multiplies by a
    contiguous matrix. On a CPU in fp32 that is MKL's faster path when x has few rows, as in
    decoding: 1.4-1.5x per decode step at 4-32 sequences, 0.9-1.1x at 1 and 64, on the development
    machine (bench/engine_layout.py). Results are equal up to the order in which fp32 products
    sum (log-probs within 1e-4 with few rows, identical with many; putting a row in a different
    batch already moves them by as much), so a sampled sequence can part after a near-tie. A
    weight shared by several modules (tied embeddings) is changed once and stays shared;
    `load_state_dict` and `copy_` keep the layout. Returns how many weights were changed."""
    done: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and id(mod.weight) not in done:
            done.add(id(mod.weight))
            mod.weight.data = mod.weight.data.t().contiguous().t()
    return len(done)


def _contiguous_args(module: torch.nn.Module, args: tuple) -> tuple | None:
    x = args[0] if args else None
    return (x.contiguous(), *args[1:]) if isinstance(x, torch.Tensor) and not x.is_contiguous() else None


def contiguous_head_input(model: torch.nn.Module) -> None:
    """Make the LM head's input contiguous. With `logits_to_keep=1` transformers hands the head the
    last position of the prefill's hidden states, a strided view [n, 1, H]; on a CPU torch's linear
    on such a view took 4.8-5.0 s and 3.5 GB of transient memory in bf16 for 64 prompts of 53 tokens,
    against 6-7 ms after a copy, and 6.5x the time in fp32 (bench/head_input.py, bench/RESULTS.md)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, torch.nn.Module):
        head.register_forward_pre_hook(_contiguous_args)


def input_major(model: torch.nn.Module) -> bool:
    """True when every `nn.Linear` weight of `model` is stored input-major (see transpose_linear_weights)."""
    ws = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return bool(ws) and all(w.dim() == 2 and w.stride() == (1, w.shape[0]) for w in ws)


def check_weight_keys(own: dict[str, torch.Tensor], given: dict[str, torch.Tensor], params: set[int]) -> None:
    """Refuse weights that do not match the engine's model: a key it does not have (a LoRA or
    wrapped model's names, another architecture) or a parameter left out (`params`: data pointers
    of its parameters; buffers may be left out). Skipping them silently would leave the engine
    generating from stale weights while training goes on."""
    unknown = [k for k in given if k not in own]
    covered = {own[k].data_ptr() for k in given if k in own}
    missing = [k for k, t in own.items() if t.data_ptr() in params and t.data_ptr() not in covered]
    for k, v in given.items():  # every shape before any copy: a refused update leaves the engine as it was
        if k in own and own[k].shape != v.shape:
            raise ValueError(f"weight {k!r} has shape {tuple(v.shape)}; the engine's model has "
                             f"{tuple(own[k].shape)}: the weights come from another model")
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"{len(unknown)} the engine's model does not have (e.g. {', '.join(map(repr, unknown[:3]))})")
        if missing:
            parts.append(f"{len(missing)} of its parameters are missing (e.g. {', '.join(map(repr, missing[:3]))})")
        raise ValueError("weights sent to the engine do not match its model: " + "; ".join(parts)
                         + ". Send the full state dict of the same base model (LoRA merged: models.merged_state_dict).")


class HFEngine:
    """Generate from a transformers model; `load_weights` syncs it from the trainer.

    `transpose_weights`: store the copy's linear weights input-major (None: on a CPU in float32,
    where it was measured faster; see `transpose_linear_weights`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: list[int],
        pad_token_id: int,
        dtype: torch.dtype = torch.bfloat16,
        batch_size: int = 64,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        transpose_weights: bool | None = None,
    ):
        self.model = copy.deepcopy(model).to(dtype).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        if transpose_weights is None:
            device = next(self.model.parameters()).device
            transpose_weights = device.type == "cpu" and dtype == torch.float32
        if transpose_weights:
            transpose_linear_weights(self.model)
        contiguous_head_input(self.model)
        self.eos = set(eos_token_ids)
        self.pad = pad_token_id
        self.batch_size = batch_size
        self.top_p = top_p
        self.top_k = top_k
        self.version = 0
        self.generator = torch.Generator().manual_seed(seed)
        self._cache_arg = cache_arg(self.model)
        try:  # transformers raises NotImplementedError for a model class that does not say where its embeddings are
            emb = self.model.get_input_embeddings()
        except (AttributeError, NotImplementedError):  # then ids are not checked here (the model's own error stands)
            emb = None
        n = getattr(emb, "num_embeddings", None)
        self.vocab_size: int | None = n if isinstance(n, int) else None
        if self.vocab_size is not None and not 0 <= pad_token_id < self.vocab_size:
            # every batch of prompts of unequal lengths embeds it: 'index out of range in self' mid-run
            raise ValueError(f"the pad token id {pad_token_id} is outside the model's vocabulary of {self.vocab_size} "
                             "tokens: the tokenizer's pad_token was added without resizing the model's embeddings. "
                             "Set pad_token to a token of the vocabulary (e.g. the eos token) in the model folder's "
                             "tokenizer_config.json")

    def check_token_ids(self, ids: list[int] | tuple[int, ...], what: str = "a prompt") -> None:
        """Refuse a token id the model has no embedding for: inside the model it fails as 'index out of
        range in self' on a CPU, and as a device-side assert that breaks the CUDA context on a GPU."""
        if self.vocab_size is None or not ids:
            return
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{what} holds token id {bad}, outside the model's vocabulary of {self.vocab_size} "
                             f"tokens (ids 0..{self.vocab_size - 1}): the tokenizer has tokens the model has no "
                             "embedding for (added tokens without resized embeddings?), or the ids come from "
                             "another tokenizer")

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        own = self.model.state_dict()
        check_weight_keys(own, state_dict, {p.data_ptr() for p in self.model.parameters()})
        written: set[int] = set()  # tied weights appear under several keys: copy them once
        for k, v in state_dict.items():
            if own[k].data_ptr() not in written:
                own[k].copy_(v)  # copy_ keeps this copy's memory layout
                written.add(own[k].data_ptr())
        self.version = version

    def generate(self, requests: list[GenerationRequest], generator: torch.Generator | None = None
                 ) -> list[GenerationOutput]:
        """Generate every request; rows are batched `batch_size` at a time, longest prompts together.

        `generator` overrides the engine's own sampling RNG (evaluation uses its own, so that
        evaluating never changes what training samples)."""
        gen = generator if generator is not None else self.generator
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i].prompt_ids))
        out: list[GenerationOutput | None] = [None] * len(requests)
        for s in range(0, len(order), self.batch_size):
            chunk = order[s : s + self.batch_size]
            for i, o in zip(chunk, self._generate_batch([requests[i] for i in chunk], gen)):
                out[i] = o
        return out  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_batch(self, reqs: list[GenerationRequest], gen: torch.Generator) -> list[GenerationOutput]:
        if any(not r.prompt_ids for r in reqs):  # a fully masked row would generate from nothing
            raise ValueError("a generation request has an empty prompt; every prompt needs at least one token")
        resumed = sum(1 for r in reqs if r.prefix_ids)
        if resumed:  # this engine starts every response from its prompt: a prefix would be dropped silently
            raise ValueError(f"{resumed} generation request(s) carry a partial response (prefix_ids) to continue; "
                             "the hf engine cannot continue one (rollout.engine=continuous or vllm can)")
        for r in reqs:
            self.check_token_ids(r.prompt_ids)
        B = len(reqs)
        plen = max(len(r.prompt_ids) for r in reqs)
        max_new = max(0, *(r.max_new_tokens for r in reqs))  # a request for fewer than 0 tokens gets none
        ids = torch.full((B, plen), self.pad, dtype=torch.long)  # [B, P] left-padded
        attn = torch.zeros((B, plen), dtype=torch.long)
        for b, r in enumerate(reqs):
            ids[b, plen - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            attn[b, plen - len(r.prompt_ids) :] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [B, P]
        temps = torch.tensor([max(r.temperature, 1e-6) for r in reqs]).unsqueeze(1)  # [B, 1]
        greedy = torch.tensor([is_greedy(r) for r in reqs])  # [B]
        limits = torch.tensor([r.max_new_tokens for r in reqs])  # [B]
        dev = next(self.model.parameters()).device
        ids, attn, pos, temps, greedy, limits = (t.to(dev) for t in (ids, attn, pos, temps, greedy, limits))

        tokens = torch.zeros((B, max_new), dtype=torch.long, device=dev)  # [B, T]
        logps = torch.zeros((B, max_new), device=dev)  # [B, T]
        lengths = torch.zeros(B, dtype=torch.long, device=dev)
        done = limits <= 0  # a request for 0 new tokens gets none, even beside others
        stopped = torch.zeros(B, dtype=torch.bool, device=dev)
        eos = torch.tensor(sorted(self.eos), device=dev)

        past = None
        step_ids, step_pos, step_attn = ids, pos, attn
        rows = torch.arange(B, device=dev)  # original row of each row still in the batch
        for t in range(max_new):
            kwargs = {self._cache_arg: past} if past is not None else {}
            outp = self.model(input_ids=step_ids, attention_mask=step_attn, position_ids=step_pos,
                              use_cache=True, logits_to_keep=1, **kwargs)
            past = getattr(outp, self._cache_arg)
            logits = outp.logits[:, -1, :].float() / temps[rows]  # [b, V]
            logprobs_full = torch.log_softmax(logits, dim=-1)  # [b, V]
            g = greedy[rows]
            if bool(g.all()):
                nxt = logits.argmax(-1)
            else:
                filtered = _filter_logits(logits, self.top_k, self.top_p)
                sampled = draw(filtered.softmax(-1), gen)  # [b]
                nxt = torch.where(g, logits.argmax(-1), sampled)
            active = ~done[rows]  # [b]
            nxt = torch.where(active, nxt, torch.full_like(nxt, self.pad))
            tokens[rows, t] = nxt
            logps[rows, t] = logprobs_full.gather(1, nxt.unsqueeze(1)).squeeze(1)
            lengths[rows] += active.long()
            is_eos = torch.isin(nxt, eos) & active
            stopped[rows] |= is_eos
            done[rows] |= is_eos | (lengths[rows] >= limits[rows])
            if bool(done.all()):
                break
            step_ids = nxt.unsqueeze(1)  # [b, 1]
            step_attn = torch.cat([step_attn, torch.ones((len(rows), 1), dtype=torch.long, device=dev)], dim=1)
            step_pos = step_pos[:, -1:] + 1
            # Finished rows leave the batch once a quarter of it is done: decode cost follows
            # the sequences still running instead of the longest one.
            keep = (~done[rows]).nonzero().squeeze(1)
            if keep.numel() <= 0.75 * len(rows) and hasattr(past, "batch_select_indices"):
                past.batch_select_indices(keep)
                rows, step_ids, step_attn, step_pos = rows[keep], step_ids[keep], step_attn[keep], step_pos[keep]

        outs = []
        for b in range(B):
            n = int(lengths[b])
            reason: FinishReason = "stop" if bool(stopped[b]) else "length"
            outs.append(GenerationOutput(tokens[b, :n].tolist(), logps[b, :n].tolist(), [self.version] * n, reason,
                                         reqs[b].request_id))
        return outs

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "version": self.version}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.version = int(state["version"])
