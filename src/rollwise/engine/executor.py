"""The rollout executor: turns the planner's requests into finished groups of samples.

It sits between the loop and the engine and owns the two ways rollwise avoids generating
a token twice:

* **partial rollouts** (APRIL): the first round of a step ends as soon as `stop_fraction` of
  its groups (carried ones included) have finished; the unfinished samples of the others are
  carried, tokens, log-probs and versions included, into the next step, where they go
  first in line and finish under newer weights. A carried sample whose oldest token is
  more than `retention_limit` versions old is dropped and counted;
* **speculative reuse** (SPEC-RL): a prompt that comes back has its previous responses
  verified under the current weights (`ContinuousEngine.verify`); only the rejected tails
  are generated.

Every requested sample ends up in exactly one place: a finished group handed to the loop,
the carry buffer, or the `dropped_stale` count.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rollwise.engine.hf import GenerationOutput, GenerationRequest, HFEngine
from rollwise.planner.base import Request


@dataclass
class _Group:
    uid: str
    expected: int = 0
    done: list[GenerationOutput] = field(default_factory=list)
    pending: list[GenerationRequest] = field(default_factory=list)
    carried: bool = False  # started in an earlier step
    # request ids of the prompt's first request of a step (carried ones included): the responses speculative reuse banks
    first_ids: set[int] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return self.expected > 0 and len(self.done) >= self.expected


@dataclass
class RoundOutput:
    """Finished groups of one round: the step's own, and carried ones from earlier steps."""

    groups: dict[str, list[GenerationOutput]]
    adopted: dict[str, list[GenerationOutput]]


def _cut_topk(topk: Any, n: int) -> Any:
    """The first n tokens' top-k, per token (a list) or packed ((ids [L, K], probs [L, K]))."""
    return (topk[0][:n], topk[1][:n]) if isinstance(topk, tuple) else topk[:n]


def _oldest(versions: list[int]) -> int | None:
    return min(versions) if versions else None


class RolloutExecutor:
    def __init__(self, engine: HFEngine, prompt_ids: dict[str, list[int]], max_new_tokens: int, temperature: float,
                 partial: bool = False, retention_limit: int = 2, speculative: bool = False, lenience: float = 1.0,
                 stop_fraction: float = 0.75, keep_kv: bool = False, sync_tokens: int | None = None,
                 between: Callable[[], bool] | None = None):
        if (partial or speculative) and not hasattr(engine, "run_round"):
            raise ValueError("partial rollouts and speculative reuse need the continuous engine (rollout.engine=continuous)")
        self.engine = engine
        self.prompt_ids = prompt_ids
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.partial = partial
        self.retention_limit = retention_limit
        self.stop_fraction = stop_fraction
        self.keep_kv = keep_kv
        # In-flight weight updates (asynchronous training): every `sync_tokens` sampled tokens the round
        # pauses and calls `between()`, which returns True when it loaded new weights; sequences in flight
        # keep their tokens and continue, their KV recomputed under the new weights unless keep_kv.
        self.sync_tokens = sync_tokens
        self.between = between
        self._next_id = 0  # request ids are unique across rounds: carried requests keep theirs
        self.speculative = speculative
        self.lenience = lenience
        self.carried: dict[str, _Group] = {}
        self.bank: dict[str, list[GenerationOutput]] = {}  # uid -> last finished responses (speculative reuse)
        self.totals = dict.fromkeys(("requested", "delivered", "dropped_stale"), 0)
        self._step: dict[str, float] = {}
        self._s_per_token = 0.0  # engine seconds per sampled token, last measured (time/spec_saved_s)
        self._banked: set[str] = set()  # uids whose bank entry holds this step's responses
        self._asked: set[str] = set()  # uids requested so far this step

    # ------------------------------------------------------------------ one round
    @property
    def streams(self) -> bool:
        """Whether `generate(on_groups=...)` can hand out groups while the round runs: a continuous
        engine, and neither partial rollouts (their round stops early) nor in-flight weight updates."""
        return bool(getattr(self.engine, "accepts_feed", False)) and not self.partial and self.between is None

    def generate(self, requests: list[Request], first_round: bool = True,
                 on_groups: Callable[[RoundOutput], list[Request]] | None = None) -> RoundOutput:
        """Generate the planner's requests (plus, in a step's first round, the carried groups).

        Speculative reuse draws on the bank only in a step's first round: the bank then holds the
        previous step's responses; later rounds would re-verify this step's own responses under
        the same weights and hand back copies of them.

        With `on_groups` (streaming; needs `self.streams`) each group is handed to
        `on_groups(RoundOutput)` as soon as its last sample finishes, and the requests it returns
        join the running engine round: follow-up rounds (probe top-ups, growth, stages) fill slots
        instead of waiting for the round's slowest response. Everything is delivered through
        `on_groups`; the RoundOutput returned is then empty."""
        if on_groups is not None and not self.streams:
            raise ValueError("streaming rounds need the continuous engine without partial rollouts or in-flight "
                             "weight updates")
        groups: dict[str, _Group] = {}
        queue: list[tuple[str, GenerationRequest]] = []  # (owner uid, request), carried first
        if first_round:
            self._banked, self._asked = set(), set()
        if first_round and self.carried:
            self.drop_stale()
            for uid, g in self.carried.items():
                groups[uid] = g
                queue += [(uid, q) for q in g.pending]
                g.pending = []
            self.carried = {}
        sampled0 = self._sampled()  # before _enqueue: verifying reused responses samples a token at each rejection
        queue += self._enqueue(requests, groups, reuse=first_round)
        owner = {q.request_id: uid for uid, q in queue}
        reqs = [q for _, q in queue]
        t0 = time.perf_counter()
        self._step["engine_rounds"] = self._step.get("engine_rounds", 0.0) + 1
        if on_groups is not None:
            finished = self._stream(reqs, groups, owner, on_groups)
            unfinished: list[GenerationRequest] = []
        elif self.partial and first_round and hasattr(self.engine, "run_round"):
            target = max(1, math.floor(self.stop_fraction * sum(g.expected > 0 for g in groups.values()) + 1e-9))
            complete = sum(g.complete for g in groups.values())
            counts = {uid: len(g.done) for uid, g in groups.items()}
            seen = [0]

            def stop_when(fin: list[GenerationOutput]) -> bool:
                nonlocal complete
                for o in fin[seen[0]:]:
                    uid = owner[o.request_id]
                    counts[uid] += 1
                    complete += counts[uid] == groups[uid].expected
                seen[0] = len(fin)
                return complete >= target

            finished, unfinished = self._run(reqs, stop_when, hold=self.keep_kv)
        elif hasattr(self.engine, "run_round"):
            # a follow-up round: rows the first round held (partial_keep_kv) wait for the next step
            with getattr(self.engine, "held_aside", contextlib.nullcontext)():
                finished, unfinished = self._run(reqs)
        else:
            finished, unfinished = self.engine.generate(reqs), []
            for q, o in zip(reqs, finished):
                o.request_id = q.request_id
        callback_s = self._step.pop("callback_s", 0.0)  # scoring and planning inside an overlapped round
        self._step["engine_s"] = self._step.get("engine_s", 0.0) + time.perf_counter() - t0 - callback_s
        new_tokens = (self._sampled() - sampled0) if sampled0 is not None else sum(len(o.response_ids) for o in finished)
        self._step["generated_tokens"] = self._step.get("generated_tokens", 0.0) + new_tokens
        if on_groups is not None:
            return RoundOutput({}, {})
        for o in finished:
            groups[owner[o.request_id]].done.append(o)
        for q in unfinished:
            groups[owner[q.request_id]].pending.append(q)
        out = self._deliver(groups, [u for u, g in groups.items() if g.complete and not g.pending])
        for uid, g in groups.items():
            if g.expected > 0:
                g.carried = True
                self.carried[uid] = g
        self._step["carried_samples"] = float(sum(len(g.pending) for g in self.carried.values()))
        return out

    def _enqueue(self, requests: list[Request], groups: dict[str, _Group], reuse: bool
                 ) -> list[tuple[str, GenerationRequest]]:
        """Add the planner's requests to `groups`; the engine requests to run (reused prefixes first), with ids."""
        reused: list[tuple[str, GenerationOutput]] = []
        caps: list[int] = []  # each reused response's request cap (a Request may set its own)
        fresh: list[tuple[str, GenerationRequest]] = []
        queue: list[tuple[str, GenerationRequest]] = []
        # a prompt's first request of the step (in the first round, or a back-fill prompt new in a later one) is
        # an unselected draw the bank may keep; a later request of the same prompt (a top-up, growth, a stage) is
        # asked for because of its own first rewards, and is not banked
        firsts = {r.uid for r in requests if reuse or r.uid not in self._asked}
        self._asked.update(r.uid for r in requests)
        for r in requests:
            g = groups.setdefault(r.uid, _Group(r.uid))
            g.carried = False  # requested again this step: it is this step's group
            g.expected += r.n
            self.totals["requested"] += r.n
            olds = self._from_bank(r.uid, r.n) if self.speculative and reuse else []
            reused += [(r.uid, o) for o in olds]
            caps += [r.max_new_tokens or self.max_new_tokens] * len(olds)
            fresh += [(r.uid, self._request(r)) for _ in range(r.n - len(olds))]
        if reused:  # verified old responses: complete, or a prefix to continue first
            before = self._spec_stats()
            items: list[Any] = [None] * len(reused)
            for cap in sorted(set(caps)):  # verified under the cap its request asks for, as a fresh sample would be
                idx = [i for i, c in enumerate(caps) if c == cap]
                got = self.engine.verify([self.prompt_ids[reused[i][0]] for i in idx],  # type: ignore[attr-defined]
                                         [reused[i][1] for i in idx], self.lenience, self.temperature, cap)
                for i, item in zip(idx, got):
                    items[i] = item
            for (uid, _), item in zip(reused, items):
                if isinstance(item, GenerationOutput):
                    groups[uid].done.append(item)
                    if item.request_id is not None:  # a first-round response whatever id its engine kept
                        groups[uid].first_ids.add(item.request_id)
                else:
                    queue.append((uid, replace(item, request_id=None)))
            for k, v in self._spec_stats().items():
                self._step[k] = self._step.get(k, 0.0) + v - before.get(k, 0.0)
        queue += fresh
        out = [(uid, q if q.request_id is not None else replace(q, request_id=self._new_id())) for uid, q in queue]
        for uid, q in out:  # what the bank may keep of them (_deliver)
            if uid in firsts:
                groups[uid].first_ids.add(q.request_id)
        return out

    def _deliver(self, groups: dict[str, _Group], uids: list[str]) -> RoundOutput:
        """Take the complete groups `uids` out of `groups` into a RoundOutput (carried ones as adopted)."""
        out = RoundOutput({}, {})
        for uid in uids:
            g = groups.pop(uid)
            # in the order requested, not finished: an engine finishes short responses first, so the first of a
            # group would be its shortest (report's unseen-prompt solve rate and --fit read groups in order;
            # a first visit has nothing to reuse, and responses reused whole by speculative reuse come first)
            g.done.sort(key=lambda o: -1 if o.request_id is None else o.request_id)
            (out.adopted if g.carried else out.groups)[uid] = g.done
            self.totals["delivered"] += len(g.done)
            if self.speculative:  # a prompt's first request of the step only (reused whole ones included): a later
                # request for the same prompt (top-ups, growth, stages) is asked for because of its first rewards, so
                # a bank with its responses held more of the outcome that asked for it (stages that stop at the first
                # correct response banked a correct one in every group that found one)
                kept = [o for o in g.done if o.response_ids and (o.request_id is None or o.request_id in g.first_ids)]
                self.bank[uid] = self.bank[uid] + kept if uid in self._banked else kept
                self._banked.add(uid)
        return out

    def _stream(self, reqs: list[GenerationRequest], groups: dict[str, _Group], owner: dict[int | None, str],
                on_groups: Callable[[RoundOutput], list[Request]]) -> list[GenerationOutput]:
        """One engine round that hands out each group when it completes and takes in follow-up requests."""

        def hand_out(complete: list[str]) -> list[GenerationRequest]:
            if not complete:
                return []
            tc = time.perf_counter()
            asked = on_groups(self._deliver(groups, complete))
            self._step["callback_s"] = self._step.get("callback_s", 0.0) + time.perf_counter() - tc
            new = self._enqueue(asked, groups, reuse=False)
            owner.update((q.request_id, uid) for uid, q in new)
            return [q for _, q in new]

        def feed(fin: list[GenerationOutput]) -> list[GenerationRequest]:
            complete: list[str] = []
            for o in fin:
                g = groups[owner[o.request_id]]
                g.done.append(o)
                if g.complete and g.uid not in complete:
                    complete.append(g.uid)
            return hand_out(complete)

        reqs = reqs + hand_out([u for u, g in groups.items() if g.complete])  # complete before the round (reuse)
        finished, unfinished = self.engine.run_round(reqs, feed=feed)  # type: ignore[attr-defined]
        assert not unfinished
        return finished

    def _run(self, reqs: list[GenerationRequest], stop_when: Callable[[list[GenerationOutput]], bool] | None = None,
             hold: bool = False) -> tuple[list[GenerationOutput], list[GenerationRequest]]:
        """engine.run_round, cut into chunks of `sync_tokens` with `between()` called after each."""
        engine: Any = self.engine
        if self.between is None or not self.sync_tokens:
            return engine.run_round(reqs, stop_when=stop_when, hold=hold)
        finished: list[GenerationOutput] = []
        pending = reqs
        while True:
            stop = None if stop_when is None else (lambda fin, done=finished: stop_when(done + fin))
            fin, pending = engine.run_round(pending, stop_when=stop, token_budget=self.sync_tokens, hold=True)
            finished += fin
            if not pending or (stop_when is not None and stop_when(finished)):
                break
            if self.between() and not self.keep_kv:
                engine.drop_held()  # AReaL: in-flight sequences are re-prefilled under the new weights
        if not hold:
            engine.drop_held()
        return finished, pending

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _sampled(self) -> float | None:
        st = getattr(self.engine, "stats", None)
        return st["sampled_tokens"] if st is not None and "sampled_tokens" in st else None

    def step_tokens(self) -> int:
        """Tokens sampled by the engine this step so far (reused tokens are not counted)."""
        return int(self._step.get("generated_tokens", 0.0))

    def _from_bank(self, uid: str, n: int) -> list[GenerationOutput]:
        """Up to n of uid's banked responses: all when it holds no more, else n drawn at random (a
        seeded draw, reproducible on resume). Taking the first n would favour the responses reused
        whole last time, which are the short ones, and speculative sampling is exact only for a plain
        draw from the old policy."""
        bank = self.bank.get(uid, [])
        if len(bank) <= n:
            return list(bank)
        rng = random.Random(zlib.crc32(f"{uid}:{self._next_id}".encode()))
        return [bank[i] for i in sorted(rng.sample(range(len(bank)), n))]

    def step_dropped_tokens(self) -> int:
        """Tokens of carried samples dropped as too stale this step (generated, never delivered)."""
        return int(self._step.get("dropped_stale_tokens", 0.0))

    def _request(self, r: Request) -> GenerationRequest:
        return GenerationRequest(self.prompt_ids[r.uid], r.max_new_tokens or self.max_new_tokens, self.temperature)

    def drop_stale(self) -> None:
        """Drop carried samples whose oldest token is more than retention_limit versions old."""
        version = self.engine.version
        for uid in list(self.carried):
            g = self.carried[uid]
            for kind in ("pending", "done"):
                keep = []
                for item in getattr(g, kind):
                    versions = item.prefix_versions if kind == "pending" else item.versions
                    old = _oldest(versions)
                    if old is not None and version - old > self.retention_limit:
                        g.expected -= 1
                        self.totals["dropped_stale"] += 1
                        self._step["dropped_stale"] = self._step.get("dropped_stale", 0.0) + 1
                        self._step["dropped_stale_tokens"] = self._step.get("dropped_stale_tokens", 0.0) + len(versions)
                    else:
                        keep.append(item)
                setattr(g, kind, keep)
            if g.expected <= 0:
                del self.carried[uid]

    # ------------------------------------------------------------------ bookkeeping
    def buffered(self) -> int:
        """Samples held in the carry buffer (finished or not) that have not been delivered."""
        return sum(g.expected for g in self.carried.values())

    def _spec_stats(self) -> dict[str, float]:
        st = getattr(self.engine, "stats", {})
        return {k: float(v) for k, v in st.items() if k.startswith("spec_")}

    def metrics(self) -> dict[str, float]:
        """This step's executor metrics (reset on read).

        time/spec_saved_s estimates what speculative reuse saved: the reused tokens at this step's
        generation speed (seconds per sampled token; the last step's that sampled any, where this one
        reused everything), minus the verification time."""
        step, self._step = self._step, {}
        m = {f"rollout/{k}": step[k] for k in ("generated_tokens", "carried_samples", "dropped_stale",
                                               "dropped_stale_tokens", "engine_rounds") if k in step}
        m["rollout/buffered"] = float(self.buffered())
        m["rollout/dropped_stale_total"] = float(self.totals["dropped_stale"])
        if self.speculative:
            old, acc = step.get("spec_old_tokens", 0.0), step.get("spec_accepted_tokens", 0.0)
            sampled, engine_s = step.get("generated_tokens", 0.0), step.get("engine_s", 0.0)
            if sampled:  # seconds per sampled token; a step that reused everything sampled none: the last rate
                self._s_per_token = engine_s / sampled
            m.update({
                "spec/candidates": step.get("spec_candidates", 0.0),
                "spec/tokens_reused": acc,
                "spec/acceptance_rate": acc / old if old else 0.0,
                "spec/full_reuse": step.get("spec_full_reuse", 0.0),
                "time/spec_verify_s": step.get("spec_verify_s", 0.0),
                "time/spec_saved_s": acc * self._s_per_token - step.get("spec_verify_s", 0.0),
            })
        return m

    def state_dict(self) -> dict[str, Any]:
        return {"carried": self.carried, "bank": self.bank, "totals": dict(self.totals), "next_id": self._next_id,
                "s_per_token": self._s_per_token, "max_new_tokens": self.max_new_tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.carried = state["carried"]
        for g in self.carried.values():
            if "first_ids" not in vars(g):  # a checkpoint from before first_ids: carried requests are first-round ones
                g.first_ids = {o.request_id for o in g.done} | {q.request_id for q in g.pending}
        self.bank = state["bank"]
        self.totals = dict(state["totals"])
        self._next_id = int(state.get("next_id", 0))
        self._s_per_token = float(state.get("s_per_token", 0.0))
        self._fit_carried(state.get("max_new_tokens"))
        if not hasattr(self.engine, "run_round"):
            self._restart_carried()

    def _fit_carried(self, saved_cap: int | None = None) -> None:
        """Carried samples of a checkpoint continue under this run's rollout.max_completion_length and
        temperature, which a resume may change (lowering the cap is the advice for running out of memory):
        a prefix or response longer than the cap is cut to it and ends as "length", as a sample drawn
        under that cap would. A sample whose Request set its own cap (other than the checkpoint's
        `saved_cap`) keeps it, lowered to this run's cap where that is lower."""
        cap = self.max_new_tokens

        def fit(q: GenerationRequest) -> GenerationRequest:
            c = cap if saved_cap in (None, q.max_new_tokens) else min(q.max_new_tokens, cap)
            return replace(q, max_new_tokens=c, temperature=self.temperature, prefix_ids=q.prefix_ids[:c],
                           prefix_logprobs=q.prefix_logprobs[:c], prefix_versions=q.prefix_versions[:c],
                           prefix_topk=_cut_topk(q.prefix_topk, c))

        for g in self.carried.values():
            g.pending = [fit(q) for q in g.pending]
            g.done = [o if len(o.response_ids) <= cap else
                      replace(o, response_ids=o.response_ids[:cap], logprobs=o.logprobs[:cap], versions=o.versions[:cap],
                              finish_reason="length", topk=_cut_topk(o.topk, cap))
                      for o in g.done]

    def _restart_carried(self) -> None:
        """An engine without run_round (rollout.engine=hf) cannot continue a response: the carried
        samples of a partial-rollouts checkpoint restart from the prompt, said once."""
        started = [q for g in self.carried.values() for q in g.pending if q.prefix_ids]
        if not started:
            return
        for g in self.carried.values():
            g.pending = [replace(q, prefix_ids=[], prefix_logprobs=[], prefix_versions=[], prefix_topk=[])
                         for q in g.pending]
        print(f"rollwise: note: the checkpoint holds {len(started)} partly generated samples "
              f"({sum(len(q.prefix_ids) for q in started)} tokens) that this engine cannot continue; they restart "
              "from the prompt (rollout.engine=continuous continues them)", file=sys.stderr)
