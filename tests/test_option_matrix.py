"""Every preset under every combination of the rollout options (partial rollouts, overlapped rounds,
speculative reuse), under a rollout and a token budget, through the real planner, executor and
produce_batch on bench/partial_budget.py's scripted engine (no model): nothing raises, every
requested sample is delivered, buffered or dropped, the tokens counted are the tokens the engine
sampled, and the budget holds on average. The interactions of these options are where audits found
defects that single-option tests missed."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rollwise.config import PlannerConfig, RewardConfig
from rollwise.engine.executor import RolloutExecutor
from rollwise.loop import overlap_rounds, produce_batch
from rollwise.planner import STRATEGIES, build_planner

spec = importlib.util.spec_from_file_location("partial_budget", Path(__file__).parents[1] / "bench" / "partial_budget.py")
pb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pb)

UIDS = pb.UIDS[:48]  # small enough that prompts come back (speculative reuse draws on their last responses)


MODES = {  # name: (partial rollouts, overlapped rounds, speculative reuse); overlap needs whole rounds
    "plain": (False, False, False), "partial": (True, False, False), "overlap": (False, True, False),
    "spec": (False, False, True), "partial+spec": (True, False, True), "overlap+spec": (False, True, True)}


def _build(strategy: str, mode: str, budget: int | None, tasks: int = 2, **planner):
    """The planner (PlannerConfig fields in `planner` override the strategy's and the token budget), executor
    and scripted engine of a run over UIDS, split among `tasks` tasks (t0:q0, t1:q1, ...)."""
    partial, overlap, spec = MODES[mode]
    name, _, followup = strategy.partition(":")
    cfg = PlannerConfig(**{"strategy": name, "seed": 0, "budget_tokens": budget,
                           "screen_followup": followup or "same_step", **planner})
    uids = [f"t{i % tasks}:{u}" for i, u in enumerate(UIDS)]
    ids = {u: [100 + i] for i, u in enumerate(uids)}
    run = SimpleNamespace(planner=build_planner(cfg, uids, 8, 8, 64, 0, prompt_lengths=[4 + i % 7 for i in range(len(uids))]),
                          runner=pb.Scorer(), tokenizer=SimpleNamespace(decode=lambda ids, **kw: str(ids[-1])),
                          items_by_uid={u: SimpleNamespace(task=u[:2]) for u in uids}, ids_by_uid=ids,
                          replay_bank={}, primary="r", cfg=SimpleNamespace(planner=cfg, reward=RewardConfig()))
    # lengths stretched per prompt (x0.5-2): whole groups finish apart, so partial rollouts carry some
    engine = pb.ScriptedEngine({100 + i: u for i, u in enumerate(UIDS)}, 1,
                               {v[0]: 0.5 + 0.5 * (i % 4) for i, v in enumerate(ids.values())})
    ex = RolloutExecutor(engine, ids, 64, 1.0, partial=partial, retention_limit=2, stop_fraction=0.75,
                         speculative=spec)
    stream = overlap and overlap_rounds(SimpleNamespace(rollout=SimpleNamespace(overlap_rounds=True)), ex, run.planner)
    return run, engine, ex, stream


def _checkpoint(run, engine, ex) -> bytes:
    """What the loop saves (planner, replay bank, executor), torch.save'd as the checkpoint is, plus the
    scripted engine's random state (the real engine's generator is in its own state_dict)."""
    buf = io.BytesIO()
    torch.save({"planner": run.planner.state_dict(), "replay_bank": run.replay_bank, "executor": ex.state_dict(),
                "engine_rng": engine.rng.bit_generator.state, "version": engine.version}, buf)
    return buf.getvalue()


def _restore(blob: bytes, run, engine, ex) -> None:
    state = torch.load(io.BytesIO(blob), weights_only=False)
    run.planner.load_state_dict(state["planner"])
    run.replay_bank = state["replay_bank"]
    ex.load_state_dict(state["executor"])
    engine.rng.bit_generator.state, engine.version = state["engine_rng"], state["version"]


def _run(strategy: str, mode: str, budget_tokens: int | None, steps: int = 24, resume_at: int | None = None,
         planner: dict | None = None, changes: dict | None = None):
    """`steps` steps; with `resume_at`, the run is checkpointed before that step and continued by fresh
    objects loaded from the checkpoint, as a killed run is resumed (with the PlannerConfig fields `changes`
    changed by the resume; `planner` sets fields for the whole run)."""
    partial = MODES[mode][0]
    run, engine, ex, stream = _build(strategy, mode, budget_tokens, **(planner or {}))
    rows, trained = [], []
    for step in range(steps):
        if step == resume_at:
            blob = _checkpoint(run, engine, ex)
            run, engine, ex, stream = _build(strategy, mode, budget_tokens, **{**(planner or {}), **(changes or {})})
            _restore(blob, run, engine, ex)
        sampled = engine.stats["sampled_tokens"]
        p = produce_batch(run, step, ex, stream=stream)
        m = p.executor_metrics
        for smp in p.batch:  # on-policy, or as stale as partial rollouts' retention limit allows
            if not smp.stop_gradient:
                assert len(smp.versions) == len(smp.response_ids) and smp.versions, smp
                assert 0 <= step - min(smp.versions) <= (2 if partial else 0), (step, smp.versions)
        rows.append((m["rollout/rollouts"], m["rollout/tokens"], len(p.batch), p.tokens,
                     engine.stats["sampled_tokens"] - sampled, m.get("spec/tokens_reused", 0.0)))
        trained.append([(s.prompt_uid, s.group_id, tuple(s.response_ids), tuple(s.behaviour_logprobs), tuple(s.versions), s.reward, s.stop_gradient)
                        for s in p.batch])
        engine.version = step + 1
    return rows, ex, stream, trained


# rollout.overlap_rounds=true: every preset that can take groups one by one (DAPO's and DARS's second
# rounds need the whole first round; the config refuses the option for them); adaptive also with its
# probes' follow-ups queued for the next step (planner.screen_followup=next_step)
CASES = [(s, m) for s in [*STRATEGIES, "adaptive:next_step"] for m in MODES
         if not (MODES[m][1] and s in ("dapo", "dars"))]


@pytest.mark.parametrize("budget_tokens", [None, 700])
@pytest.mark.parametrize(("strategy", "mode"), CASES)
def test_every_preset_keeps_its_samples_and_its_budget_under_every_rollout_option(strategy, mode, budget_tokens
                                                                                 ) -> None:
    rows, ex, stream, _ = _run(strategy, mode, budget_tokens)
    t = ex.totals
    assert t["requested"] == t["delivered"] + t["dropped_stale"] + ex.buffered(), (t, ex.buffered())
    r = np.array(rows)
    assert (r[:, 3] == r[:, 4]).all(), "the step's tokens are the tokens the engine sampled"
    if MODES[mode][2]:
        assert r[6:, 5].sum() > 0, "speculative reuse reused nothing"
    assert stream == MODES[mode][1]
    delivered, tokens = r[6:, 0], r[6:, 1]
    if strategy != "dapo":  # DAPO back-fills past its budget by design (docs/planner.md, Budgets)
        if budget_tokens is None:
            assert delivered.mean() <= 64 * 1.15, delivered
        else:
            assert tokens.mean() <= budget_tokens * 1.15, tokens
    assert r[:, 2].sum() > 0  # something was trained


@pytest.mark.parametrize(("strategy", "mode"), CASES)
def test_a_run_checkpointed_and_resumed_mid_way_trains_what_the_uninterrupted_run_trains(strategy, mode) -> None:
    """Planner belief, carried partial samples, the speculative bank, the replay bank and every random
    state survive the checkpoint: the resumed run trains the same samples, step for step."""
    rows, _, _, trained = _run(strategy, mode, 700, steps=16)
    rows2, _, _, trained2 = _run(strategy, mode, 700, steps=16, resume_at=9)
    assert trained2 == trained
    assert rows2 == rows
