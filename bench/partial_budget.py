"""Does `adaptive` keep its step budget with partial rollouts? A scripted engine, no model.

    .venv/bin/python bench/partial_budget.py            # seconds

The planner, the rollout executor and the loop's `produce_batch` are rollwise's own; only the engine
is scripted: every sequence grows one token per tick, its length is fixed by its request id (2-20
tokens), and its last token says whether it is right, drawn from its prompt's solve rate (400 prompts
at 0, 0.05, 0.5, 0.95 or 1). `adaptive` with 8 prompts of 8 a step (budget 64 rollouts) runs 30 steps
without and with `rollout.partial_rollouts` (stop at 75% of groups, retention limit 2). Per step,
means over steps 10-29: rollouts requested (first round and follow-ups), of which follow-ups (probe
top-ups and growth), rollouts delivered, tokens sampled, and the allocator's cost per prompt.

An audit (2026-12-07) found that with partial rollouts a carried group was charged to the budget
twice (when requested and when adopted) and that its empty group lowered the cost per prompt, so
`adaptive` chose about twice as many prompts and asked for no follow-ups.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from rollwise.config import PlannerConfig, RewardConfig
from rollwise.engine.executor import RolloutExecutor
from rollwise.engine.hf import GenerationOutput, GenerationRequest, RoundFeed, RoundStop
from rollwise.loop import produce_batch
from rollwise.planner import build_planner

UIDS = [f"q{i}" for i in range(400)]
RATES = dict(zip(UIDS, np.random.default_rng(0).choice([0.0, 0.05, 0.5, 0.95, 1.0], size=len(UIDS))))
LENGTHS = [2 + (i * 7) % 19 for i in range(97)]


class ScriptedEngine:
    """All sequences of a round grow one token per tick; a sequence of request id r ends at
    LENGTHS[r % 97] tokens with a last token 1 (right) or 0. Unfinished sequences come back with their
    prefix, log-probs and versions, as the continuous engine's do. Like the continuous engine it takes
    follow-up requests into a running round (`feed`, overlapped rounds) and verifies old responses for
    speculative reuse (`verify`: a seeded share kept whole, else a random prefix kept and one token
    drawn), and counts what it samples in `stats`. `scale` (prompt token -> factor) stretches a prompt's
    lengths, so that whole groups finish at different ticks."""

    accepts_feed = True

    def __init__(self, uid_of: dict[int, str], seed: int, scale: dict[int, float] | None = None) -> None:
        self.uid_of, self.rng, self.version, self.scale = uid_of, np.random.default_rng(seed), 0, scale or {}
        self.stats = dict.fromkeys(("sampled_tokens", "spec_candidates", "spec_old_tokens", "spec_accepted_tokens",
                                    "spec_full_reuse", "spec_verify_s"), 0)

    def run_round(self, reqs, stop_when=None, token_budget=None, hold=False, feed=None, generator=None):
        live = [self._live(r) for r in reqs]
        finished: list[GenerationOutput] = []
        produced, stop, follow = 0, RoundStop(stop_when, token_budget), RoundFeed(feed)
        while True:
            live += [self._live(r) for r in follow(finished)]
            if not live or stop(produced, finished):
                break
            still = []
            for item in live:
                r, ids, lps, vs = item
                ids.append(5)
                lps.append(-0.5)
                vs.append(self.version)
                if len(ids) >= max(2, round(LENGTHS[r.request_id % len(LENGTHS)] * self.scale.get(r.prompt_ids[0], 1))):
                    ids[-1] = int(self.rng.random() < RATES[self.uid_of[r.prompt_ids[0]]])
                    finished.append(GenerationOutput(ids, lps, vs, "stop", request_id=r.request_id))
                else:
                    still.append(item)
            produced += len(live)
            self.stats["sampled_tokens"] += len(live)
            live = still
        return finished, [replace(r, prefix_ids=ids, prefix_logprobs=lps, prefix_versions=vs) for r, ids, lps, vs in live]

    @staticmethod
    def _live(r):
        return [r, list(r.prefix_ids), list(r.prefix_logprobs), list(r.prefix_versions)]

    def verify(self, prompts, olds, lenience, temperature, max_new_tokens):
        out = []
        for prompt, old in zip(prompts, olds):
            L = len(old.response_ids)
            n = L if self.rng.random() < 0.3 else int(self.rng.integers(0, L))
            self.stats["spec_candidates"] += 1
            self.stats["spec_old_tokens"] += L
            self.stats["spec_accepted_tokens"] += n
            if n == L:
                self.stats["spec_full_reuse"] += 1
                out.append(GenerationOutput(list(old.response_ids), [-0.5] * L, [self.version] * L, "stop"))
                continue
            self.stats["sampled_tokens"] += 1  # the token drawn at the first rejection
            ids = list(old.response_ids[:n]) + [5]
            out.append(GenerationRequest(list(prompt), max_new_tokens, temperature, prefix_ids=ids,
                                         prefix_logprobs=[-0.5] * len(ids), prefix_versions=[self.version] * len(ids)))
        return out


class Scorer:
    def score(self, texts, items):
        rewards = [1.0 if t == "1" else 0.0 for t in texts]
        return SimpleNamespace(rewards=rewards, parts=[{"r": x} for x in rewards], errors=0, timeouts=0, nans=0)


def run(partial: bool, steps: int = 30) -> dict[str, float]:
    cfg = PlannerConfig(strategy="adaptive", seed=0)
    ids = {u: [100 + i] for i, u in enumerate(UIDS)}
    loop_run = SimpleNamespace(planner=build_planner(cfg, UIDS, 8, 8, 64, 0), runner=Scorer(),
                               tokenizer=SimpleNamespace(decode=lambda ids, **kw: str(ids[-1])),
                               items_by_uid={u: SimpleNamespace(task="t") for u in UIDS}, ids_by_uid=ids,
                               replay_bank={}, primary="r", cfg=SimpleNamespace(planner=cfg, reward=RewardConfig()))
    engine = ScriptedEngine({v[0]: u for u, v in ids.items()}, 1)
    ex = RolloutExecutor(engine, ids, 64, 1.0, partial=partial, retention_limit=2, stop_fraction=0.75)
    asked = {"all": 0, "follow": 0}
    generate = ex.generate

    def counted(requests, first_round=False, **kw):
        n = sum(r.n for r in requests)
        asked["all"] += n
        asked["follow"] += 0 if first_round else n
        return generate(requests, first_round=first_round, **kw)

    ex.generate = counted
    rows = []
    for step in range(steps):
        asked.update(all=0, follow=0)
        p = produce_batch(loop_run, step, ex)
        rows.append([asked["all"], asked["follow"], p.executor_metrics["rollout/rollouts"], p.tokens,
                     loop_run.planner.allocator.cost_per_prompt])
        engine.version = step + 1
    m = np.mean(rows[10:], axis=0)
    return dict(zip(["requested", "follow-ups", "delivered", "tokens", "cost per prompt"], m))


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print("| partial rollouts | rollouts requested | of them follow-ups | rollouts delivered | tokens sampled "
          "| cost per prompt |")
    print("|---|---|---|---|---|---|")
    for partial in (False, True):
        m = run(partial)
        print(f"| {'on' if partial else 'off'} | {m['requested']:.1f} | {m['follow-ups']:.1f} | {m['delivered']:.1f} "
              f"| {m['tokens']:.0f} | {m['cost per prompt']:.2f} |")
    print("\nbudget: 64 rollouts a step; means over steps 10-29")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    main()
