"""Named strategies: presets of the four parts that reproduce published methods.

| strategy | estimator      | selector            | allocator | repair | filter |
|----------|----------------|---------------------|-----------|--------|--------|
| uniform  | window         | all                 | fixed     | none   | no     |
| dapo     | window         | filter (back-fill)  | fixed     | none   | yes    |
| greso    | window         | skip                | fixed     | none   | no     |
| mopps    | beta           | posterior (target)  | fixed     | none   | no     |
| vade     | two_scale_beta | posterior (info)    | fixed     | none   | no     |
| knapsack | last_visit     | all                 | knapsack  | none   | no     |
| dars     | window         | all                 | hardness  | none   | yes    |
| ar3po    | window         | all                 | staged    | replay | no     |
| e3       | rank           | all                 | rank      | none   | no     |
| adaptive | irt            | posterior (expected)| screen*   | replay | no     |

* growth of informative groups capped at each task's share of the step (stratify_rollouts).

`adaptive` is rollwise's own combination (not a published method): a logistic belief that
follows the policy's progress, selection by the expected gradient signal within each task's
share of the data mixture (`stratify`), a cheap probe before a full group for prompts
expected to teach nothing, growth of informative groups capped at each task's share of the
step's rollouts (`stratify_rollouts`), and replay for all-wrong groups.

Any part can be swapped by name in the config (planner.estimator, planner.selector, ...).
"""

from __future__ import annotations

import warnings
from typing import Any

from rollwise.planner.allocators import ALLOCATORS, Allocator, make_allocator
from rollwise.planner.base import groupwise
from rollwise.planner.core import MAX_ROUNDS, ComposedPlanner
from rollwise.planner.estimators import make_estimator
from rollwise.planner.repair import make_repair
from rollwise.planner.selectors import SELECTORS, Selector, make_selector
from rollwise.planner.warm import read_prior_counts, warm_start

PRESETS: dict[str, dict[str, Any]] = {
    "uniform": {"estimator": "window", "selector": "all", "allocator": "fixed", "repair": "none"},
    "dapo": {"estimator": "window", "selector": "filter", "allocator": "fixed", "repair": "none", "filter": True},
    "greso": {"estimator": "window", "selector": "skip", "allocator": "fixed", "repair": "none"},
    "mopps": {"estimator": "beta", "selector": "posterior", "allocator": "fixed", "repair": "none"},
    "vade": {"estimator": "two_scale_beta", "selector": "posterior", "allocator": "fixed", "repair": "none",
             "score": "info"},
    "knapsack": {"estimator": "last_visit", "selector": "all", "allocator": "knapsack", "repair": "none"},
    "dars": {"estimator": "window", "selector": "all", "allocator": "hardness", "repair": "none", "filter": True},
    "ar3po": {"estimator": "window", "selector": "all", "allocator": "staged", "repair": "replay"},
    "e3": {"estimator": "rank", "selector": "all", "allocator": "rank", "repair": "none"},
    "adaptive": {"estimator": "irt", "selector": "posterior", "allocator": "screen", "repair": "replay",
                 "score": "expected", "stratify": True, "stratify_rollouts": True},
}

STRATEGIES: tuple[str, ...] = tuple(PRESETS)


def whole_round_parts(cfg: Any) -> list[str]:
    """The parts of the planner `cfg` (a PlannerConfig) names that decide their extra rounds from a
    whole round at once, so they cannot be shown groups one by one (rollout.overlap_rounds)."""
    preset = PRESETS.get(cfg.strategy, {})
    sel, alloc = cfg.selector or preset.get("selector"), cfg.allocator or preset.get("allocator")
    out = [f"selector '{sel}'"] if sel in SELECTORS and not groupwise(SELECTORS[sel], Selector) else []
    return out + ([f"allocator '{alloc}'"] if alloc in ALLOCATORS and not groupwise(ALLOCATORS[alloc], Allocator)
                  else [])


# options read by one kind of part only: (part, the part's names that read them) -> options
_READERS: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {
    ("estimator", ("beta", "irt")): ("posterior_decay",),
    ("estimator", ("two_scale_beta",)): ("vade_fast_decay", "vade_slow_decay", "vade_fast_weight"),
    ("estimator", ("window", "last_visit", "rank")): ("estimator_window",),
    ("estimator", ("irt",)): ("group_prior", "length_prior"),
    ("selector", ("posterior",)): ("selection_score", "candidate_factor", "stratify", "revisit_discount",
                                   "score_per_token"),
    ("selector", ("filter",)): ("dapo_max_rounds", "dapo_oversample"),
    ("selector", ("skip",)): tuple(f"greso_{k}" for k in (
        "explore_init", "explore_step", "explore_min", "explore_max", "zero_variance_target", "easy_threshold",
        "hard_threshold")),
    ("allocator", ("knapsack", "rank")): ("min_samples_per_prompt",),
    ("allocator", ("knapsack", "hardness", "rank", "screen")): ("max_samples_per_prompt",),
    ("allocator", ("knapsack",)): ("min_observations",),
    ("allocator", ("staged",)): ("ar3po_stages", "ar3po_stage_size", "staged_rule"),
    ("allocator", ("hardness",)): ("dars_schedule",),
    ("allocator", ("screen",)): ("screen_size", "screen_threshold", "screen_growth", "screen_followup",
                                 "stratify_rollouts"),
}
# the parts whose decisions read the estimator's belief (the others keep their own counts or none)
BELIEF_SELECTORS, BELIEF_ALLOCATORS = ("posterior",), ("knapsack", "rank", "screen")
PART_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {k: reader for reader, keys in _READERS.items() for k in keys}


def part(cfg: Any, name: str) -> str | None:
    """The part `name` (estimator, selector, allocator, repair) a PlannerConfig's planner uses: its own
    setting, else its strategy's."""
    return getattr(cfg, name) or PRESETS.get(cfg.strategy, {}).get(name)


def screen_allocator(cfg: Any) -> bool:
    """Whether a PlannerConfig's planner allocates with the screen allocator."""
    return part(cfg, "allocator") == "screen"


def _belief_unread_by(cfg: Any) -> str:
    """"" when a part of a PlannerConfig's planner reads the estimator's belief, else the sentence that
    says none does (for the messages about options that shape or start the belief)."""
    sel, alloc = part(cfg, "selector"), part(cfg, "allocator")
    # a posterior selector given no more candidates than it picks scores none: it reads no belief
    if (sel in BELIEF_SELECTORS and cfg.candidate_factor > 1) or alloc in BELIEF_ALLOCATORS:
        return ""
    why = (f", as planner.candidate_factor={cfg.candidate_factor:g} leaves the selector nothing to score"
           if sel in BELIEF_SELECTORS else "")
    return (f"which only selector {' or '.join(BELIEF_SELECTORS)} and allocator {' or '.join(BELIEF_ALLOCATORS)} "
            f"read; strategy '{cfg.strategy}' (selector '{sel}', allocator '{alloc}') decides without it{why}")


def belief_unread(cfg: Any) -> str:
    """Why a PlannerConfig's estimator setting changes only planner/brier ("" if a part reads it):
    `planner.estimator` or an estimator option on a strategy whose selector and allocator decide
    without the belief. A warning, not an error: runs made so are resumed, and comparing estimators'
    Brier scores under one selection is a use."""
    fields = type(cfg).model_fields
    shaping = [k for k, (p, _) in PART_OPTIONS.items() if p == "estimator" and getattr(cfg, k) != fields[k].default]
    unread = _belief_unread_by(cfg) if cfg.estimator or shaping else ""
    if not unread:
        return ""
    what = f"planner.estimator={cfg.estimator}" if cfg.estimator else f"planner.{shaping[0]}"
    return f"{what} shapes the estimator's belief, {unread}, so it changes only planner/brier"


def unused_options(cfg: Any) -> str:
    """Why a PlannerConfig sets, to other than its default, an option that none of the parts of
    its planner reads ("" if it does not): such an option would be accepted and ignored."""
    preset = PRESETS.get(cfg.strategy, {})
    fields = type(cfg).model_fields
    for key, (part, names) in PART_OPTIONS.items():
        value = getattr(cfg, key)
        if value == fields[key].default:
            continue
        used = getattr(cfg, part) or preset.get(part)
        if used not in names:
            return (f"planner.{key}={value} is read only by planner.{part}={' or '.join(names)}; strategy "
                    f"'{cfg.strategy}' uses {part} '{used}' (choose planner.{part}, or drop {key})")
    sel, alloc = cfg.selector or preset.get("selector"), cfg.allocator or preset.get("allocator")
    unread = _belief_unread_by(cfg) if cfg.prior_counts else ""
    if unread:
        return f"planner.prior_counts starts the estimator, {unread} (choose such a part, or drop prior_counts)"
    score = cfg.selection_score or preset.get("score", "target")
    if cfg.target_solve_rate != fields["target_solve_rate"].default and (sel != "posterior" or score != "target"):
        why = f"scores candidates by '{score}'" if sel == "posterior" else f"uses selector '{sel}'"
        return (f"planner.target_solve_rate={cfg.target_solve_rate} is read only by planner.selector=posterior with "
                f"planner.selection_score=target; strategy '{cfg.strategy}' {why}")
    changed = [k for k in fields if getattr(cfg, k) != fields[k].default]
    if sel == "posterior" and cfg.candidate_factor <= 1:
        scoring = [k for k in ("selection_score", "stratify", "revisit_discount", "score_per_token",
                               "target_solve_rate") if k in changed]
        if scoring:
            return (f"planner.candidate_factor={cfg.candidate_factor:g} gives the posterior selector no more "
                    f"candidates than it picks, so it scores none and planner.{scoring[0]} has no effect; raise "
                    "candidate_factor above 1 or drop it")
    if alloc == "screen" and cfg.screen_followup == "next_step":
        later = [k for k in ("screen_growth", "stratify_rollouts", "max_samples_per_prompt") if k in changed]
        if later:
            return (f"planner.{later[0]} acts in the screen allocator's same-step follow-up rounds; "
                    "planner.screen_followup=next_step has none (drop it, or use screen_followup=same_step)")
    if sel == "filter" and cfg.filter_zero_variance is False:
        return ("planner.filter_zero_variance=false has no effect with the filter selector (dapo): it trains only on "
                "groups with a gradient by design; choose another selector to train on equal-reward groups")
    return ""


def group_cap_error(cfg: Any, num_generations: int) -> str | None:
    """Why planner.max_samples_per_prompt cannot hold under an allocator that gives a prompt a whole group before it
    adds any (adaptive's screen, dars's hardness); None where it can."""
    hi, alloc = cfg.max_samples_per_prompt, part(cfg, "allocator")
    if hi is None or hi >= num_generations or alloc not in ("hardness", "screen"):
        return None
    return (f"planner.max_samples_per_prompt ({hi}) is below rollout.num_generations ({num_generations}), the group "
            f"allocator '{alloc}' (strategy '{cfg.strategy}') gives a prompt before it adds any: raise it to "
            f"{num_generations} or more, or lower rollout.num_generations")


def make_planner(
    cfg: Any,
    uids: list[str],
    prompts_per_step: int,
    num_generations: int,
    max_completion_length: int,
    seed: int,
    prompt_lengths: list[int] | list[float] | None = None,
) -> ComposedPlanner:
    """Build the planner that `cfg` (a PlannerConfig) names."""
    if cfg.strategy not in PRESETS:
        raise ValueError(f"unknown planner strategy '{cfg.strategy}'; allowed: {', '.join(STRATEGIES)}")
    if num_generations < 1 or prompts_per_step < 1:
        raise ValueError("prompts_per_step and num_generations must be >= 1")
    why = unused_options(cfg)
    if why:
        raise ValueError(why)
    cap = group_cap_error(cfg, num_generations)
    if cap:
        raise ValueError(cap)
    cool = cfg.revisit_cooldown
    if cool and cool * prompts_per_step >= len(uids):
        warnings.warn(f"planner.revisit_cooldown={cool} can keep {cool} x {prompts_per_step} prompts a step = "
                      f"{cool * prompts_per_step} out at once, not fewer than the pool's {len(uids)}: steps then fill "
                      "with prompts that never gave a gradient; give a cooldown below "
                      f"{max(1, -(-len(uids) // prompts_per_step))}", stacklevel=2)
    for key, reader, value in (("dapo_max_rounds", "filter", cfg.dapo_max_rounds),
                               ("ar3po_stages", "staged", cfg.ar3po_stages)):
        if value > MAX_ROUNDS and reader in (part(cfg, "selector"), part(cfg, "allocator")):
            warnings.warn(f"planner.{key}={value} is above the planner's limit of {MAX_ROUNDS} rounds a step: "
                          f"a step stops after {MAX_ROUNDS}", stacklevel=2)
    preset = PRESETS[cfg.strategy]
    if cfg.stratify_rollouts is None:  # resolved once, so every part reads the preset's choice
        cfg = cfg.model_copy(update={"stratify_rollouts": preset.get("stratify_rollouts", False)})
    size = len(uids)
    est = make_estimator(cfg.estimator or preset["estimator"], size, cfg, list(uids), prompt_lengths)
    if cfg.prior_counts:
        warm_start(est, {u: i for i, u in enumerate(uids)}, read_prior_counts(cfg.prior_counts), cfg.prior_counts)
    stratify = preset.get("stratify", False) if cfg.stratify is None else cfg.stratify
    sel = make_selector(cfg.selector or preset["selector"], size, cfg, cfg.selection_score or preset.get("score", "target"),
                        stratify)
    alloc = make_allocator(cfg.allocator or preset["allocator"], cfg, num_generations)
    rep = make_repair(cfg.repair or preset["repair"], size)
    filt = preset.get("filter", False) if cfg.filter_zero_variance is None else cfg.filter_zero_variance
    return ComposedPlanner(
        cfg.strategy,
        list(uids),
        num_generations,
        est,
        sel,
        alloc,
        rep,
        budget_rollouts=cfg.budget_rollouts or prompts_per_step * num_generations,
        budget_tokens=cfg.budget_tokens,
        max_completion_length=max_completion_length,
        seed=seed,
        cfg=cfg,
        filter_zero_variance=bool(filt),
    )
