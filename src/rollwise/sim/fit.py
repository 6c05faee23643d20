"""Fit the simulated world to a training run's own rollouts (`rollwise simulate --fit RUN_DIR`).

A run logs every group it rolled out (`rollout/groups` in metrics.jsonl: uid and the
outcomes, 1 correct / 0 not, in the order the samples were requested). The first visit of each prompt in the run's first steps is a draw from the policy's
solve rates near the start, with no selection by outcome (no planner has a belief about a
prompt it has never seen). A planner that tops up a probe after seeing it (adaptive's
screening) only changes how many samples a group has, on the strength of what it saw, and the
binomial likelihood of what was seen stays valid under such stopping rules. The fit's check
compares the first m outcomes of every first visit (m = the smallest first visit) with the
fitted world's prediction: those were drawn whatever they showed, so the comparison is fair
even under a planner that stops early.

The model is the simulator's item-response one (`world.py`): a prompt of task t is unsolvable
with probability u, else solved with rate sigmoid(a * (m_t - s * z)), z standard normal,
a ~ LogNormal(log(discrimination), 0.25), where m_t is the task's level at the start plus, for a
visit after training began, lr * X: X the effective samples trained on before the visit's step
per uniform batch (the simulator's `signal` law, so lr is its --lr), counted as the simulator
counts them: a prompt's k-th group with a signal adds revisit_decay^k of its effective samples
(`--revisit-decay`, 0.85 by default), and with K > 1 tasks a task's skill moved by
transfer * X + (1 - transfer) * K * X_t, X_t the part of X from its own prompts (`--transfer`, 0.5:
the simulator's split of a step's gain between every task and the tasks trained on). Counted in full,
revisits made lr read 17% low under `adaptive` on a 400-prompt pool; one gain for every task read the
tasks' spread 0.13 too wide with 4 tasks (the hard ones, learning slower, read harder still).
Maximum likelihood over the
task levels m_t, the within-task spread s, lr (where visits come from different steps) and u, by L-BFGS on a quadrature (torch, float64); standard errors from
the observed information. u is kept only where the all-wrong groups call for it: a likelihood-
ratio test against u = 0 at 5% (what a first visit cannot tell is whether a prompt at a zero
rate stays there; the simulator keeps such prompts unsolvable for good). Where lr is fitted,
the spread may grow with the signal too: s becomes sqrt(s^2 + (g X)^2) at a visit, kept on the
same test against g = 0 given u; the simulator's `--polarise-law add` is that law. The simulator's world then has skill0 = mean(m_t), task_sd =
sd(m_t) over the tasks, difficulty_sd = sqrt(task_sd^2 + s^2).

With `rollout.partial_rollouts` a sample carried into the next step counts in the step it
finishes, so a first visit holds only the samples that finished in it (the long ones are missing).

A sample cut at the run's length cap (rollout.max_completion_length) is read as it was scored,
mostly wrong: the fit has no cap of its own, so it fits the rate of answers correct within the
cap. The share cut is measured (from the logged lengths, else rollout/truncated_frac) and
`simulate --fit` warns above CUT_WARN (`cut_warning`).

What the rollouts cannot tell, the fit does not invent: the drift and the transfer between
tasks keep the simulator's defaults (or the flags given), and the length model is not fitted
(compare strategies in rollouts, not tokens).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rollwise.sim.world import SimParams
from rollwise.tracking import read_metrics

# the simulator's default revisit decay (SimParams.revisit_decay): the signal the fit counts is the simulator's
REVISIT_DECAY = SimParams.revisit_decay
# the simulator's default share of a step's skill gain that reaches every task (SimParams.transfer)
TRANSFER = SimParams.transfer
# the share of the fitted samples cut at the length cap above which `simulate --fit` warns (see `cut_share`)
CUT_WARN = 0.10
# what truncation did to the fit where it was measured: simulated uniform runs, 2,000 prompts, skill0 -1.5, half the
# samples cut (the simulator's length model), against the same runs uncut; 8 seeds at spread 1 and no unsolvable
# share, 4 at spread 2.5 and 10% unsolvable (docs/planner.md)
CUT_EFFECT = ("which way depends on how length and correctness go together in the run: in simulated runs with half "
              "the samples cut, lr read 37-62% low and the spread 22-45% low, and where the hardest prompts' answers "
              "were the longest they were read as unsolvable (share 0.24 for 0.10) and skill0 read 0.4 too high, -1.07 "
              "for -1.5")


class FitError(ValueError):
    """The run cannot be fitted; the message says why and what to do."""


@dataclass
class Visit:
    task: str
    outcomes: str  # "1" correct, "0" not, in the order requested
    step: int
    signal: float = 0.0  # effective samples trained on before this step, per uniform batch (k-th signal: decay^k)
    cut: int | None = None  # samples at the run's length cap (None: the run logged no lengths, or no cap)
    task_signal: float | None = None  # the part of `signal` from prompts of this visit's task (None: unknown)

    @property
    def n(self) -> int:
        return len(self.outcomes)

    @property
    def correct(self) -> int:
        return self.outcomes.count("1")


@dataclass
class WorldFit:
    tasks: list[str]
    levels: list[float]  # m_t: each task's skill minus its mean difficulty (logit scale)
    spread: float  # s: sd of difficulty within a task
    unsolvable: float  # u
    groups: int
    loglik: float
    se_skill0: float | None = None
    se_spread: float | None = None
    unsolvable_given: bool = False  # fixed by the caller, not fitted
    lr_unsolvable: float | None = None  # 2 * log-likelihood gain of a free unsolvable share over none
    learning: float | None = None  # skill gain per effective sample per uniform batch (the simulator's lr)
    se_learning: float | None = None
    growth: float | None = None  # g: the spread's growth per effective sample per uniform batch (kept on a test)
    se_growth: float | None = None
    lr_growth: float | None = None  # 2 * log-likelihood gain of a growing spread over a fixed one
    # the fit on the other side of the unsolvable test (u = 0, or u free): (skill0, spread, u). A zero
    # rate and a hard tail explain all-wrong groups alike, so the two can differ by several SEs, which
    # are conditional on the test's choice
    other_branch: tuple[float, float, float] | None = None
    # the 95% profile-likelihood interval of u (the shares whose best fit is within LR_PROFILE of the best
    # overall), and what skill0 and the spread are across it: honest where the two branches trade off
    unsolvable_interval: tuple[float, float] | None = None
    skill0_range: tuple[float, float] | None = None
    spread_range: tuple[float, float] | None = None
    # tasks whose every first visit was all wrong -> their first visits: their level is beyond what the
    # rollouts measure, so their prompts are counted in the unsolvable share (u includes them) and fitted no further
    hopeless: dict[str, int] = field(default_factory=dict)
    # the share of the fitted samples cut at the run's length cap (`fitted_cut_share`), and what it was read
    # from: "lengths" (the first visits' own) or "truncated_frac" (every sample of the steps fitted); None: unknown
    truncated: float | None = None
    truncated_from: str | None = None
    transfer: float = TRANSFER  # the simulator's transfer between tasks the learning was read under (`exposure`)

    @property
    def hopeless_share(self) -> float:
        """Share of the first visits that fell in hopeless tasks (h; u = h + (1 - h) * the rest's share)."""
        return sum(self.hopeless.values()) / self.groups if self.groups else 0.0

    @property
    def unsolvable_in_fitted_tasks(self) -> float:
        """The unsolvable share among the prompts of the tasks that were fitted (hopeless ones aside)."""
        h = self.hopeless_share
        return (self.unsolvable - h) / (1.0 - h) if h < 1.0 else 0.0

    @property
    def skill0(self) -> float:
        return float(np.mean(self.levels))

    @property
    def task_sd(self) -> float:
        return float(np.std(self.levels, ddof=1)) if len(self.levels) > 1 else 0.0

    @property
    def difficulty_sd(self) -> float:
        return math.sqrt(self.task_sd**2 + self.spread**2)


def first_visits(run_dir: str | Path, fit_steps: int | None = None, n_ref: int | None = None,
                 revisit_decay: float = REVISIT_DECAY) -> list[Visit]:
    """The first group of every prompt the run rolled out at steps 1..fit_steps (None: all). With
    `n_ref` (the uniform batch, prompts_per_step * num_generations) each visit also carries the
    effective samples of every earlier step over n_ref (`signal`), the simulator's measure of
    what training had seen: sum over groups of n * 4c(n - c)/n^2, a group of a prompt that had a
    signal k times before counted revisit_decay^k of that (the simulator's `--revisit-decay`, whose
    default this is: the fitted lr is then the lr that simulator's learning law needs), and the part of
    it from prompts of the visit's own task (`task_signal`, for the split by transfer). Where the run
    logged response lengths and its config a length cap (rollout.max_completion_length), each visit
    also counts its samples at the cap (`cut`)."""
    if not 0.0 <= revisit_decay <= 1.0:
        raise FitError(f"the revisit decay is a factor in [0, 1] (1 = a revisit teaches like a new prompt), got {revisit_decay}")
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise FitError(f"{run_dir} has no metrics.jsonl; give --fit the folder of a `rollwise train` run "
                       "(runs/<name>)")
    rows = [r for r in read_metrics(run_dir) if "rollout/rollouts" in r]
    if not rows:
        raise FitError(f"{run_dir}/metrics.jsonl has no training step yet; train at least one step first")
    if not any("rollout/groups" in r for r in rows):
        raise FitError(f"{run_dir}/metrics.jsonl has no per-group outcomes (rollout/groups): the run was made "
                       "by a rollwise older than `simulate --fit`; train a few steps with this version "
                       "(e.g. `rollwise train train.max_steps=5`) and fit that run")
    cap = length_cap(run_dir)
    seen: set[str] = set()
    signals: Counter[str] = Counter()  # times each prompt gave a signal: its next one counts revisit_decay^k
    out: list[Visit] = []
    signal = 0.0
    by_task: Counter[str] = Counter()  # the signal so far from each task's prompts
    for r in sorted(rows, key=lambda r: r["step"]):
        if "rollout/groups" not in r:  # a step logged by an older rollwise: its prompts are unknown, so no later
            if not seen:               # group is known to be a first visit (it may be a revisit chosen by outcome)
                raise FitError(f"{run_dir}: step {r['step']} was logged with no rollout/groups (a rollwise older than "
                               "`simulate --fit`), so no later group is known to be a prompt's first visit; fit a "
                               "run trained from its start with this version")
            break
        groups = r["rollout/groups"]
        for uid, outcomes, *lengths in groups:  # runs since 2026-12-04 add the response lengths
            if uid in seen:
                continue
            seen.add(uid)
            if (fit_steps is None or r["step"] <= fit_steps) and outcomes:
                cut = (sum(int(x) >= cap for x in lengths[0]) if cap is not None and lengths
                       and len(lengths[0]) == len(outcomes) else None)
                task = uid.split(":", 1)[0]
                out.append(Visit(task, str(outcomes), int(r["step"]), signal, cut,
                                 by_task[task] if n_ref else None))
        if n_ref:
            step_signal = 0.0
            for uid, outcomes, *_ in groups:
                c = outcomes.count("1")
                if 0 < c < len(outcomes):  # a signal: the simulator discounts a prompt's k-th one by decay^k
                    e = 4.0 * c * (len(outcomes) - c) / len(outcomes) * revisit_decay ** signals[uid] / n_ref
                    step_signal += e
                    by_task[uid.split(":", 1)[0]] += e
                    signals[uid] += 1
            signal += step_signal
    return out


def length_cap(run_dir: str | Path) -> int | None:
    """The run's rollout.max_completion_length, from its config.yaml (None where it has none)."""
    try:
        cfg = yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {}
        return int(cfg["rollout"]["max_completion_length"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return None


def cut_share(visits: list[Visit]) -> tuple[float, int] | None:
    """The share of the samples at the run's length cap among the first visits that know it, and how many
    samples that is out of (None where no visit knows: a run that logged no response lengths)."""
    known = [v for v in visits if v.cut is not None]
    total = sum(v.n for v in known)
    return (sum(v.cut or 0 for v in known) / total, total) if total else None


def logged_cut_share(run_dir: str | Path, fit_steps: int | None = None) -> tuple[float, int] | None:
    """The share of all samples cut at the length cap in steps 1..fit_steps from the run's
    `rollout/truncated_frac` (for runs that logged no response lengths), and of how many samples."""
    rows = [r for r in read_metrics(run_dir) if "rollout/truncated_frac" in r and "rollout/rollouts" in r
            and (fit_steps is None or r["step"] <= fit_steps)]
    total = sum(r["rollout/rollouts"] for r in rows)
    return (sum(r["rollout/truncated_frac"] * r["rollout/rollouts"] for r in rows) / total, int(total)) if total else None


def fitted_cut_share(runs: list[str | Path], visits: list[Visit],
                     fit_steps: int | None = None) -> tuple[float, str] | None:
    """The share of samples cut at the length cap among the first visits fitted (from their lengths), or,
    for runs that logged none, among every sample of the steps fitted (rollout/truncated_frac); and which."""
    got = cut_share(visits)
    if got is not None:
        return got[0], "lengths"
    logged = [x for x in (logged_cut_share(r, fit_steps) for r in runs) if x is not None]
    total = sum(n for _, n in logged)
    return (sum(s * n for s, n in logged) / total, "truncated_frac") if total else None


def cut_warning(fit: WorldFit, threshold: float = CUT_WARN) -> str | None:
    """What a fit to a run with many samples cut at the length cap does not tell (None below `threshold`)."""
    if fit.truncated is None or fit.truncated <= threshold:
        return None
    what = ("of the first visits' samples fitted" if fit.truncated_from == "lengths"
            else "of the samples in the steps fitted (rollout/truncated_frac; the run logged no lengths)")
    return (f"{fit.truncated:.0%} {what} were cut at rollout.max_completion_length. The fit reads each as it was "
            "scored (a cut answer mostly as wrong) and has no length cap of its own, so it fits the rate of answers "
            "correct within the cap, not the policy's: the fitted skill0, spread and lr take the cut in, and "
            f"{CUT_EFFECT}. Fit a run trained with a larger rollout.max_completion_length (under "
            f"{threshold:.0%} cut), or read the simulated world as one where the cut answers are wrong for good")


def run_scale(run_dir: str | Path) -> dict[str, int]:
    """The run's prompts per step, group size, steps and training pool, from its config.yaml. A run
    that a rollout-token budget stops (train.max_rollout_tokens) counts the steps it logged, not
    train.max_steps, which such runs set high."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FitError(f"{run_dir} has no config.yaml; give --fit the folder of a `rollwise train` run")
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise FitError(f"{path} is not valid YAML ({str(e).splitlines()[0]}); give --fit the folder of a "
                       "`rollwise train` run") from None
    try:
        scale = {"prompts_per_step": int(cfg["rollout"]["prompts_per_step"]),
                 "num_generations": int(cfg["rollout"]["num_generations"]),
                 "steps": int(cfg["train"]["max_steps"]), "pool": int(cfg["data"]["train_size"])}
    except (KeyError, TypeError, ValueError) as e:
        raise FitError(f"{path} lacks {e} (rollout.prompts_per_step, rollout.num_generations, "
                       "train.max_steps, data.train_size); is it a rollwise run's resolved config?") from None
    if (cfg.get("train") or {}).get("max_rollout_tokens") is not None:
        logged = [r["step"] for r in read_metrics(run_dir) if "rollout/rollouts" in r]
        if logged:
            scale["steps"] = min(scale["steps"], max(logged))
    return scale


# 2 * log-likelihood gain that a free unsolvable share must bring over none to be kept: the 5% critical
# value of the boundary likelihood-ratio test (a 50:50 mixture of chi2(0) and chi2(1))
LR_CRITICAL = 2.71
# 2 * log-likelihood drop that bounds the 95% profile-likelihood interval of u (chi2(1) at 95%)
LR_PROFILE = 3.84
# the shares of unsolvable prompts the profile is computed at (with its peak; the ends are found between them)
PROFILE_GRID = tuple(round(0.05 * i, 2) for i in range(19))  # 0 .. 0.9


def fit_world(visits: list[Visit], discrimination: float = 1.5, unsolvable: float | None = None,
              min_groups: int = 20, growth: bool = True, transfer: float = TRANSFER) -> WorldFit:
    """Maximum-likelihood world for these first visits. `unsolvable` fixes u; without it u is fitted
    and kept only where the likelihood-ratio test against u = 0 calls for it (LR_CRITICAL). Where the
    visits come from different points of training (and `growth`), a spread that grows with the
    training signal is fitted too and kept on the same test against a fixed spread, given u. A task
    whose every first visit was all wrong has no finite level: its prompts are taken as unsolvable (u
    counts them; see `WorldFit.hopeless`) and the other tasks are fitted. `transfer` is the simulator's:
    of the skill a visit's task gained, that share follows all the run's signal, the rest its task's
    own (`exposure`)."""
    hopeless = Counter(v.task for v in visits)
    for v in visits:
        if v.correct > 0:
            hopeless.pop(v.task, None)
    if hopeless:
        return _fold_hopeless(visits, dict(hopeless), discrimination, unsolvable, min_groups, growth, transfer)
    grow = growth and len({v.signal for v in visits}) > 1
    lr_u = None
    if unsolvable is not None:
        grown = _fit(visits, discrimination, unsolvable, min_groups, True, transfer) if grow else None
        flat = _fit(visits, discrimination, unsolvable, min_groups, False, transfer)
    else:
        free = _fit(visits, discrimination, None, min_groups, grow, transfer)
        none = _fit(visits, discrimination, 0.0, min_groups, grow, transfer)
        lr_u = 2.0 * (free.loglik - none.loglik)
        kept = free if lr_u > LR_CRITICAL else none
        other = none if kept is free else free
        alternative = (other.skill0, other.spread, other.unsolvable)
        grown = kept if grow else None
        flat = _fit(visits, discrimination, None if kept is free else 0.0, min_groups, False, transfer) if grow else kept
    best = flat
    if grown is not None:
        lr_g = 2.0 * (grown.loglik - flat.loglik)
        best = grown if lr_g > LR_CRITICAL else flat
        best.lr_growth = lr_g
    if unsolvable is None:
        best.unsolvable_given, best.lr_unsolvable, best.other_branch = False, lr_u, alternative
        _profile_unsolvable(best, visits, discrimination, min_groups, best.growth is not None, transfer)
    return best


def _fold_hopeless(visits: list[Visit], hopeless: dict[str, int], discrimination: float,
                   unsolvable: float | None, min_groups: int, growth: bool, transfer: float = TRANSFER) -> WorldFit:
    """Fit the tasks that were solved at least once; the hopeless tasks' share h of the first visits joins
    the unsolvable share: u = h + (1 - h) * u_rest (a share given for the whole run must hold h)."""
    rest = [v for v in visits if v.task not in hopeless]
    names = ", ".join(f"{t} ({k} first visits)" for t, k in sorted(hopeless.items()))
    if not rest:
        raise FitError(f"every sample of every first visit was wrong (tasks {names}): no level can be measured; fit "
                       "a longer run (or more of its steps, where --fit-steps cut them) or one whose prompts are sometimes solved")
    h = 1.0 - len(rest) / len(visits)
    if unsolvable is not None and unsolvable < h:
        raise FitError(f"--unsolvable {unsolvable:g} is below the share of first visits in tasks never solved "
                       f"({h:.3f}: {names}), which the fit counts as unsolvable; give --unsolvable {math.ceil(h * 1000) / 1000:g} "
                       "or more, or leave it out")
    if len(rest) < min_groups:
        raise FitError(f"only {len(rest)} of the {len(visits)} first visits are in tasks solved at least once ({names} "
                       f"never were: set aside as unsolvable); at least {min_groups} are needed: fit a longer run (or "
                       "more of its steps, where --fit-steps cut them)")
    fit = fit_world(rest, discrimination, None if unsolvable is None else (unsolvable - h) / (1.0 - h),
                    min_groups, growth, transfer)

    def fold(u: float) -> float:
        return h + (1.0 - h) * u

    fit.unsolvable = float(unsolvable) if unsolvable is not None else fold(fit.unsolvable)
    if fit.unsolvable_interval is not None:
        fit.unsolvable_interval = (fold(fit.unsolvable_interval[0]), fold(fit.unsolvable_interval[1]))
    if fit.other_branch is not None:
        fit.other_branch = (*fit.other_branch[:2], fold(fit.other_branch[2]))
    fit.groups, fit.hopeless = len(visits), hopeless
    return fit


def _profile_unsolvable(best: WorldFit, visits: list[Visit], discrimination: float, min_groups: int,
                        growth: bool, transfer: float = TRANSFER) -> None:
    """Fill best's 95% profile-likelihood interval of u: the shares u whose best fit (every other
    parameter refitted, growth as in `best`) is within LR_PROFILE / 2 of the best log-likelihood of
    that family (a growing spread's fits, which the test may have turned down, have a parameter more),
    and the range of skill0 and of the spread over the fits inside it. The profile is computed at
    PROFILE_GRID's points and at its peak (the fit with u free); each end is found between the last
    point inside and the first outside, on the signed root of the likelihood-ratio drop (linear in u
    where the profile is quadratic), refined with fits at the estimate: a run of a thousand groups has a
    profile narrower than the grid's step, where a linear interpolation of the drop put the ends inside
    (or at the peak itself). The likelihood-ratio test picks one branch; the interval says how far the
    data let u (and with it skill0) move, which the SEs, conditional on u, do not."""
    free = _fit(visits, discrimination, None, min_groups, growth, transfer)
    fits = {float(u): _fit(visits, discrimination, u, min_groups, growth, transfer) for u in PROFILE_GRID}
    fits.setdefault(free.unsolvable, free)
    top = max(best.loglik, *(f.loglik for f in fits.values()))

    def drop(u: float) -> float:
        return 2.0 * (top - fits[u].loglik)

    peak = min(fits, key=drop)

    def end(side: int) -> float:  # where the profile crosses LR_PROFILE beyond the peak on this side (-1, +1)
        for _ in range(4):
            us = sorted(u for u in fits if (u - peak) * side >= 0)[:: side]  # from the peak outwards
            out = next((k for k, u in enumerate(us) if drop(u) > LR_PROFILE), None)
            if out is None:  # inside to the grid's end
                return us[-1]
            if out == 0:  # the peak itself is below the best fit by more than the cut: no interval beyond it
                return peak
            i, j = us[out - 1], us[out]
            r_i, r_j, r_cut = math.sqrt(max(drop(i), 0.0)), math.sqrt(drop(j)), math.sqrt(LR_PROFILE)
            t = (r_cut - r_i) / (r_j - r_i) if r_j > r_i else 0.0
            u = float(i + min(max(t, 0.0), 1.0) * (j - i))
            if u in fits or abs(j - i) < 1e-4:
                return u
            fits[u] = _fit(visits, discrimination, u, min_groups, growth, transfer)
            if abs(math.sqrt(max(drop(u), 0.0)) - r_cut) < 0.05:
                return u
        return u

    lo, hi = min(end(-1), best.unsolvable), max(end(+1), best.unsolvable)
    best.unsolvable_interval = (lo, hi)
    for u in (lo, hi):
        if u not in fits:
            fits[u] = _fit(visits, discrimination, u, min_groups, growth, transfer)
    inside = [f for u, f in fits.items() if lo <= u <= hi] + [best]
    k0s, sps = [f.skill0 for f in inside], [f.spread for f in inside]
    best.skill0_range, best.spread_range = (min(k0s), max(k0s)), (min(sps), max(sps))


def exposure(visit: Visit, k: int, transfer: float = TRANSFER) -> float:
    """The signal that moved the skill of a visit's task before it, per uniform batch, in the simulator's
    world of k tasks: transfer * X + (1 - transfer) * k * X_t (X all the signal, X_t its task's; module
    docstring). A visit with no task signal (or k <= 1) has X: every task moved alike."""
    if k <= 1 or visit.task_signal is None:
        return visit.signal
    return transfer * visit.signal + (1.0 - transfer) * k * visit.task_signal


def _fit(visits: list[Visit], discrimination: float, unsolvable: float | None, min_groups: int,
         growth: bool = False, transfer: float = TRANSFER) -> WorldFit:
    import torch

    if len(visits) < min_groups:
        raise FitError(f"only {len(visits)} prompts were rolled out for the first time in the steps fitted; "
                       f"at least {min_groups} are needed: fit a longer run (or more of its steps, where --fit-steps cut them)")
    tasks = sorted({v.task for v in visits})
    for t in tasks:  # a task all wrong (or all right) has its level's maximum at infinity: nothing to fit
        got = [v for v in visits if v.task == t]
        if all(v.correct == 0 for v in got) or all(v.correct == v.n for v in got):
            what = "wrong" if got[0].correct == 0 else "correct"
            raise FitError(f"every sample of the {len(got)} first visits of task {t} was {what}: its level is beyond "
                           "what the rollouts can measure; fit a longer run (or more of its steps, where --fit-steps cut them) or one where the task's "
                           f"prompts are sometimes {'solved' if what == 'wrong' else 'failed'}")
    learn = len({v.signal for v in visits}) > 1  # first visits at different points of training
    growth = growth and learn
    counts = Counter((tasks.index(v.task), v.n, v.correct, v.signal, exposure(v, len(tasks), transfer)) for v in visits)
    keys = list(counts)
    t_idx = torch.tensor([k[0] for k in keys])
    n = torch.tensor([k[1] for k in keys], dtype=torch.float64)
    c = torch.tensor([k[2] for k in keys], dtype=torch.float64)
    x = torch.tensor([k[3] for k in keys], dtype=torch.float64)
    x_task = torch.tensor([k[4] for k in keys], dtype=torch.float64)  # what moved the visit's task (exposure)
    w = torch.tensor([counts[k] for k in keys], dtype=torch.float64)
    zero = (c == 0).to(torch.float64)
    log_binom = torch.lgamma(n + 1) - torch.lgamma(c + 1) - torch.lgamma(n - c + 1)
    # the prompt offset: a fine even grid, not Gauss-Hermite, whose 48 nodes mispriced P(c of n) by 7% at
    # the default world's spread (2.5) and by 40% at 6, moving the fitted level by more than its SE
    zs = np.linspace(-8.0, 8.0, 201)
    zw = np.exp(-0.5 * zs**2)
    xs, xw = np.polynomial.hermite_e.hermegauss(7)
    z = torch.tensor(np.repeat(zs, len(xs)), dtype=torch.float64)
    a = torch.tensor(np.tile(np.exp(math.log(discrimination) + 0.25 * xs), len(zs)), dtype=torch.float64)
    log_nw = torch.tensor(np.log(np.outer(zw, xw).ravel() / (zw.sum() * xw.sum())), dtype=torch.float64)

    def nll(theta: torch.Tensor) -> torch.Tensor:
        levels, log_s = theta[: len(tasks)], theta[len(tasks)]
        gain = theta[len(tasks) + 1] * x_task if learn else 0.0  # skill gained before the visit (the signal law)
        # the spread at the visit: fixed, or growing with the signal (sd^2 = s^2 + (g x)^2; g's sign is moot)
        sd = torch.sqrt(torch.exp(2 * log_s) + (theta[len(tasks) + 2] * x) ** 2) if growth else torch.exp(log_s)
        log_u = (torch.nn.functional.logsigmoid(theta[-1]) if unsolvable is None
                 else torch.tensor(math.log(max(unsolvable, 1e-300)), dtype=torch.float64))
        log_1mu = (torch.nn.functional.logsigmoid(-theta[-1]) if unsolvable is None
                   else torch.tensor(math.log1p(-min(unsolvable, 1 - 1e-12)), dtype=torch.float64))
        logit = a[None, :] * ((levels[t_idx] + gain)[:, None] - sd.expand_as(x)[:, None] * z[None, :])
        ll_q = (c[:, None] * torch.nn.functional.logsigmoid(logit) + (n - c)[:, None] * torch.nn.functional.logsigmoid(-logit))
        solvable = torch.logsumexp(ll_q + log_nw[None, :], dim=1) + log_1mu
        ll = torch.where(zero > 0, torch.logaddexp(solvable, log_u.expand_as(solvable)), solvable)
        return -(w * (ll + log_binom)).sum()

    # starts: each task's level from its observed rate, two spreads, and (when fitted) two unsolvable shares
    rate = [sum(v.correct for v in visits if v.task == t) / sum(v.n for v in visits if v.task == t) for t in tasks]
    base = [math.log(min(max(r, 0.01), 0.99) / (1 - min(max(r, 0.01), 0.99))) for r in rate]
    best: tuple[float, torch.Tensor] | None = None
    for s0 in (0.5, 1.5):
        for u0, g0 in [(u, g) for u in ((-3.0, 0.0) if unsolvable is None else (0.0,)) for g in ((0.3, 1.0) if growth else (0.0,))]:
            theta = torch.tensor([*base, math.log(s0), *([0.0] if learn else []), *([g0] if growth else []), u0],
                                 dtype=torch.float64, requires_grad=True)
            opt = torch.optim.LBFGS([theta], max_iter=200, tolerance_grad=1e-9, tolerance_change=1e-12,
                                    line_search_fn="strong_wolfe")

            def closure(theta: torch.Tensor = theta, opt: Any = opt) -> torch.Tensor:
                opt.zero_grad()
                loss = nll(theta)
                loss.backward()
                return loss

            opt.step(closure)
            with torch.no_grad():
                theta.data[len(tasks)].clamp_(math.log(0.01), math.log(10.0))
                theta.data[-1].clamp_(-12.0, 12.0)
            val = float(nll(theta.detach()))
            if math.isfinite(val) and (best is None or val < best[0]):
                best = (val, theta.detach().clone())
    if best is None:
        raise FitError("the fit did not converge; fit a longer run (or more of its steps, where --fit-steps cut them) or "
                       "one with larger groups")
    val, theta = best
    k = len(tasks)
    u = float(torch.sigmoid(theta[-1])) if unsolvable is None else float(unsolvable)
    fit = WorldFit(tasks, theta[:k].tolist(), float(torch.exp(theta[k])), u, len(visits), -val,
                   unsolvable_given=unsolvable is not None, learning=float(theta[k + 1]) if learn else None,
                   growth=abs(float(theta[k + 2])) if growth else None, transfer=transfer)
    ses = _standard_errors(nll, theta, k, fitted_u=unsolvable is None)
    fit.se_skill0, fit.se_spread = ses[0], ses[1]
    fit.se_learning = ses[2] if learn else None
    fit.se_growth = ses[3] if growth else None
    return fit


def _standard_errors(nll: Any, theta: Any, k: int, fitted_u: bool) -> tuple[float | None, ...]:
    """SE of mean(m_t), of s, of theta[k + 1] (the learning rate) and theta[k + 2] (the spread's
    growth), where fitted, from the observed information (None where it is singular, e.g. u at 0)."""
    import torch

    free = theta if fitted_u else theta[:-1]

    def f(x: torch.Tensor) -> torch.Tensor:
        return nll(x if fitted_u else torch.cat([x, theta[-1:]]))

    h = torch.autograd.functional.hessian(f, free).numpy()
    try:
        cov = np.linalg.inv(h)
    except np.linalg.LinAlgError:
        return None, None, None, None
    if not np.all(np.isfinite(cov)) or np.any(np.diag(cov) <= 0):
        return None, None, None, None
    g = np.zeros(len(free))
    g[:k] = 1.0 / k
    se_skill = float(math.sqrt(max(g @ cov @ g, 0.0)))
    se_s = float(math.exp(float(theta[k])) * math.sqrt(cov[k, k]))
    nxt = [float(math.sqrt(cov[j, j])) if j < len(free) else None for j in (k + 1, k + 2)]
    return se_skill, se_s, *nxt


def predicted_histogram(fit: WorldFit, n: int, discrimination: float = 1.5, size: int = 200_000,
                        task_shares: list[float] | None = None, visits: list[Visit] | None = None) -> np.ndarray:
    """Share of prompts with 0..n correct out of n samples that the fitted world predicts: at the start
    in `task_shares`, or, with `visits`, for visits drawn from these (each at its task and its point of
    training: the level moved by the learning rate and the spread grown, where fitted)."""
    rng = np.random.default_rng(0)
    u = np.full(size, fit.unsolvable)
    if visits:
        pick = rng.integers(0, len(visits), size)
        # a visit of a hopeless task is unsolvable; the others carry the fitted tasks' own share
        t = np.asarray([fit.tasks.index(v.task) if v.task in fit.tasks else -1 for v in visits])[pick]
        u = np.where(t < 0, 1.0, fit.unsolvable_in_fitted_tasks)
        t = np.maximum(t, 0)
        x = np.asarray([v.signal for v in visits])[pick]
        x_task = np.asarray([exposure(v, len(fit.tasks), fit.transfer) for v in visits])[pick]
    else:
        shares = np.asarray(task_shares if task_shares is not None else [1.0] * len(fit.tasks), dtype=float)
        t, x = rng.choice(len(fit.tasks), size, p=shares / shares.sum()), np.zeros(size)
        x_task = x
    level = np.asarray(fit.levels)[t] + (fit.learning or 0.0) * x_task
    sd = np.sqrt(fit.spread**2 + ((fit.growth or 0.0) * x) ** 2)
    a = np.exp(rng.normal(math.log(discrimination), 0.25, size))
    q = 1.0 / (1.0 + np.exp(-a * (level - sd * rng.standard_normal(size))))
    q = np.where(rng.random(size) < u, 0.0, q)
    return np.bincount(rng.binomial(n, q), minlength=n + 1) / size


def observed_histogram(visits: list[Visit], m: int) -> np.ndarray:
    """Share of first visits with 0..m correct among their first m samples (all visits need m)."""
    if any(v.n < m for v in visits):
        raise ValueError(f"every visit needs at least {m} samples")
    cs = [v.outcomes[:m].count("1") for v in visits]
    return np.bincount(np.asarray(cs, dtype=int), minlength=m + 1) / max(len(cs), 1)
