"""The `vllm` engine (GPU, optional extra `pip install '/path/to/rollwise[vllm]'`). EXPERIMENTAL: it has
not yet run on a GPU in this project's CI; tests skip without CUDA.

It speaks the same protocol as the HF engines:

* `generate(requests)`: every request to completion, outputs in request order;
* `run_round(requests, stop_when, token_budget, hold)`: requests stepped through vLLM's
  engine (`add_request` / `step`), stopped early when `stop_when(finished)` or the token
  budget says so; unfinished requests are aborted and come back resumable (prompt plus the
  response so far as prefix, with its log-probs and versions), so the executor's partial
  rollouts and the asynchronous loop's in-flight weight updates work unchanged. `hold` is
  accepted but vLLM's KV cache is not kept across rounds (its prefix cache often still hits);
  `feed(newly_finished)` returns requests that join the running round (overlapped planner
  rounds, rollout.overlap_rounds);
* `load_weights(state_dict, version)`: in-place update of the model inside vLLM's worker
  (`collective_rpc`), then its prefix cache is reset.

Each sampled request gets its own seed, drawn from the engine's generator (saved in `state_dict`,
so a resumed run samples as the uninterrupted one) or from the generator `generate` is given
(evaluation's, so evaluating never shifts training's draws).

Behaviour log-probs are vLLM's processed log-probs (after temperature and top-k/top-p), the
distribution the token was sampled from. The HF engines record the temperature-scaled log-prob of
the full distribution (before top-k/top-p). At the defaults (rollout.top_p=1, top_k=0) the two
agree; with either set, vLLM's behaviour log-probs are the filtered ones.
"""

from __future__ import annotations

import itertools
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from rollwise.engine.hf import GenerationOutput, GenerationRequest, RoundFeed, RoundStop
from rollwise.models import ModelError


class VLLMUnavailable(ModelError):
    """vLLM is not installed or no CUDA device is present; the message says what to do."""


def vllm_available() -> bool:
    try:
        require_vllm()
    except VLLMUnavailable:
        return False
    return True


def require_vllm() -> None:
    """VLLMUnavailable, saying what to do, unless vLLM is installed and a CUDA GPU is present."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise VLLMUnavailable("rollout.engine=vllm needs vLLM: pip install "
                              "'/path/to/rollwise[vllm]' from a clone of rollwise, or pip install 'vllm>=0.10.2' (a CUDA machine)") from None
    if not torch.cuda.is_available():
        raise VLLMUnavailable("rollout.engine=vllm needs a CUDA GPU; on a CPU use rollout.engine=continuous")


# vLLM keeps its forward context (attention metadata of the running step) in a module global, not per thread:
# two engines of one process stepping at once (the asynchronous loop's rollout thread and the evaluation engine)
# would run on each other's metadata. Every call into vLLM holds this lock, so their steps take turns.
_VLLM_LOCK = threading.RLock()


def _load_weights_in_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    worker.model_runner.model.load_weights(weights=weights)


class VLLMEngine:
    accepts_feed = True  # run_round(feed=...): follow-up requests join a running round
    _told_reset = False  # a refused prefix-cache reset is warned once (per engine)

    def __init__(self, model_path: str, eos_token_ids: list[int], pad_token_id: int, dtype: torch.dtype = torch.bfloat16,
                 top_p: float = 1.0, top_k: int = 0, seed: int = 0, gpu_memory_utilization: float = 0.3,
                 max_model_len: int | None = None) -> None:
        require_vllm()
        from vllm import LLM
        # the engine core in this process: weights can then be handed over without a copy through IPC
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.llm = LLM(model=model_path, dtype=str(dtype).removeprefix("torch."), seed=seed,
                       gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                       enable_prefix_caching=True, logprobs_mode="processed_logprobs")
        self.eos = list(eos_token_ids)
        self.pad = pad_token_id
        self.top_p, self.top_k = top_p, top_k
        self.version = 0
        self.seed = seed
        # each sampled request gets its own seed from this stream (saved in checkpoints): vLLM's global RNG
        # would neither resume nor stay apart from evaluation's draws
        self.generator = torch.Generator().manual_seed(seed)
        self._ids = itertools.count()
        self.stats: dict[str, float] = {"sampled_tokens": 0.0}

    # ------------------------------------------------------------------ protocol
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        with _VLLM_LOCK:
            self.llm.collective_rpc(_load_weights_in_worker, args=(list(state_dict.items()),))
            # vLLM refuses (returns False) while blocks are still held: its cached prefixes would then be the old
            # weights' keys and values, used under the new version without a word
            if self.llm.reset_prefix_cache() is False and not self._told_reset:
                self._told_reset = True  # said once: untested on a GPU here, so a warning rather than a stop
                warnings.warn("vLLM did not reset its prefix cache after a weight update (some KV blocks were still "
                              "in use): cached prompt prefixes may be served with the previous weights' keys and "
                              "values until the next reset", stacklevel=2)
        self.version = version

    def generate(self, requests: list[GenerationRequest], generator: Any = None) -> list[GenerationOutput]:
        """Every request to completion; `generator` (evaluation's own) seeds the draws instead of the
        engine's stream, so evaluating never changes what training samples."""
        keyed = [replace(r, request_id=i) for i, r in enumerate(requests)]
        finished, unfinished = self.run_round(keyed, generator=generator)
        assert not unfinished
        out = sorted(finished, key=lambda o: o.request_id or 0)
        for o, r in zip(out, requests):
            o.request_id = r.request_id
        return out

    def run_round(self, requests: list[GenerationRequest],
                  stop_when: Callable[[list[GenerationOutput]], bool] | None = None,
                  token_budget: int | None = None, generator: Any = None, hold: bool = False,
                  feed: Callable[[list[GenerationOutput]], list[GenerationRequest]] | None = None,
                  ) -> tuple[list[GenerationOutput], list[GenerationRequest]]:
        from vllm.inputs import TokensPrompt

        engine = self.llm.llm_engine
        live: dict[str, GenerationRequest] = {}
        latest: dict[str, Any] = {}
        gen = generator if generator is not None else self.generator

        finished: list[GenerationOutput] = []

        def add(r: GenerationRequest) -> None:
            if len(r.prefix_ids) >= r.max_new_tokens:  # a carried sample already at the (lowered) cap: cut there
                finished.append(GenerationOutput(list(r.prefix_ids), list(r.prefix_logprobs), list(r.prefix_versions),
                                                 "length", request_id=r.request_id))
                return
            key = f"rw-{next(self._ids)}"
            prompt, params = TokensPrompt(prompt_token_ids=list(r.prompt_ids) + list(r.prefix_ids)), self._params(r, gen)
            with _VLLM_LOCK:
                engine.add_request(key, prompt, params)
            live[key] = r

        produced, stop, follow = 0, RoundStop(stop_when, token_budget), RoundFeed(feed)
        try:
            for i, r in enumerate(requests):
                add(r if r.request_id is not None else replace(r, request_id=i))
            while True:
                for r in follow(finished):
                    add(r)
                if not live or stop(produced, finished):
                    break
                with _VLLM_LOCK:
                    step = engine.step()
                for ro in step:
                    if ro.request_id not in live:
                        continue
                    before = len(latest[ro.request_id].token_ids) if ro.request_id in latest else 0
                    latest[ro.request_id] = ro.outputs[0]
                    produced += len(ro.outputs[0].token_ids) - before
                    if ro.finished:
                        finished.append(self._output(live.pop(ro.request_id), ro.outputs[0]))
        except BaseException:
            # a failing callback (feed, stop_when) or step: requests left in vLLM would keep decoding in later
            # rounds, unseen, holding KV blocks (and the prefix cache could then not be reset)
            if live:
                with _VLLM_LOCK:
                    engine.abort_request(list(live))
            raise
        self.stats["sampled_tokens"] += produced
        unfinished = []
        if live:
            with _VLLM_LOCK:
                engine.abort_request(list(live))
            for key, r in live.items():
                unfinished.append(self._resumable(r, latest.get(key)))
        return finished, unfinished

    def drop_held(self) -> None:
        """Nothing is held across rounds: vLLM re-prefills resumed sequences (its prefix cache may hit)."""

    def state_dict(self) -> dict:
        return {"version": self.version, "rng": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.version = int(state["version"])
        if "rng" in state:  # checkpoints written before the engine kept its own stream have none
            self.generator.set_state(state["rng"])

    # ------------------------------------------------------------------ helpers
    def _params(self, r: GenerationRequest, gen: torch.Generator | None = None) -> Any:
        from vllm import SamplingParams

        left = r.max_new_tokens - len(r.prefix_ids)  # >= 1: run_round finishes a request already at its cap
        if r.greedy:
            return SamplingParams(temperature=0.0, max_tokens=left, logprobs=0, stop_token_ids=self.eos)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen if gen is not None else self.generator))
        return SamplingParams(temperature=r.temperature, top_p=self.top_p, top_k=self.top_k or -1, max_tokens=left,
                              logprobs=0, stop_token_ids=self.eos, seed=seed)

    @staticmethod
    def _sampled_logprobs(out: Any) -> list[float]:
        return [float(d[t].logprob) for t, d in zip(out.token_ids, out.logprobs or [])]

    def _output(self, r: GenerationRequest, out: Any) -> GenerationOutput:
        ids = list(out.token_ids)
        # vLLM checks the length cap before EOS: an EOS that is the last allowed token comes back as "length"
        # with the EOS in the tokens; the HF engines call that "stop", and so does this one
        tokens = list(r.prefix_ids) + ids
        reason = "stop" if out.finish_reason == "stop" or (tokens and tokens[-1] in self.eos) else "length"
        return GenerationOutput(list(r.prefix_ids) + ids, list(r.prefix_logprobs) + self._sampled_logprobs(out),
                                list(r.prefix_versions) + [self.version] * len(ids), reason, request_id=r.request_id)

    def _resumable(self, r: GenerationRequest, out: Any) -> GenerationRequest:
        if out is None:
            return r
        ids = list(out.token_ids)
        return GenerationRequest(r.prompt_ids, r.max_new_tokens, r.temperature, r.greedy,
                                 list(r.prefix_ids) + ids, list(r.prefix_logprobs) + self._sampled_logprobs(out),
                                 list(r.prefix_versions) + [self.version] * len(ids), r.request_id)
