"""Options a config sets but does not use: what `rollwise train` warns about before it starts."""

from __future__ import annotations

from typing import Any

from rollwise.config.schema import Config


def _builtin_model(c: Config) -> bool:
    from rollwise.models import BUILTIN_MODELS

    return c.model.name_or_path in BUILTIN_MODELS


def _evaluates(c: Config) -> bool:
    e = c.eval
    return c.data.eval_size > 0 and (e.at_start or e.at_end or e.every_n_steps > 0)


_LORA = "model.lora.enabled=true"
_ONE_UPDATE = (" (with one update per batch every token's ratio to the policy it is clipped against is exactly 1, "
               "so no clip bound acts)")
_CARRIES = "rollout.partial_rollouts=true with rollout.partial_stop_fraction below 1"
_IN_FLIGHT = "distributed.async_training=true with distributed.max_staleness above 0"


def _carries(c: Config) -> bool:
    """Partial rollouts that carry unfinished samples to the next round (a stop fraction of 1 carries none)."""
    return c.rollout.partial_rollouts and c.rollout.partial_stop_fraction < 1


def _in_flight_updates(c: Config) -> bool:
    """New weights can arrive while a batch generates: asynchronous training with a staleness above 0 (at 0
    the next batch starts only once the trainer has published the weights it is generated with)."""
    return c.distributed.async_training and c.distributed.max_staleness > 0


def _evals_before_end(c: Config) -> int:
    """Evaluations an early stop can count: eval.at_start's and those every eval.every_n_steps steps before
    the last step."""
    e = c.eval
    return int(e.at_start) + ((c.train.max_steps - 1) // e.every_n_steps if e.every_n_steps else 0)


def _planner_draws(c: Config) -> bool:
    """Whether the planner draws from its own random stream (planner.seed): the skip and posterior
    selectors do, and the screen allocator's expectations under an estimator that samples (not irt)."""
    from rollwise.planner.strategies import part, screen_allocator

    return (part(c.planner, "selector") in ("skip", "posterior")
            or (screen_allocator(c.planner) and part(c.planner, "estimator") != "irt"))


def _follows_up(c: Config) -> bool:
    """Whether the planner asks for more samples within a step: a part with extra rounds (adaptive's probe
    top-ups and growth, ar3po's stages, dapo's back-fill, dars's second round), unless its settings leave it
    none (planner.screen_followup=next_step, planner.ar3po_stages=1)."""
    from rollwise.planner.allocators import ALLOCATORS, Allocator
    from rollwise.planner.base import follows_up
    from rollwise.planner.selectors import SELECTORS, Selector
    from rollwise.planner.strategies import part

    pl = c.planner
    sel, alloc = part(pl, "selector"), part(pl, "allocator")
    if sel in SELECTORS and follows_up(SELECTORS[sel], Selector):
        return True
    return (alloc in ALLOCATORS and follows_up(ALLOCATORS[alloc], Allocator)
            and not (alloc == "screen" and pl.screen_followup == "next_step")
            and not (alloc == "staged" and pl.ar3po_stages == 1))


def _overlaps(c: Config) -> bool:
    """Whether rollout.overlap_rounds decides anything: follow-up rounds that could join the running round."""
    from rollwise.planner.strategies import whole_round_parts

    r, d = c.rollout, c.distributed
    return (r.engine != "hf" and not r.partial_rollouts and not (d.async_training or d.backend == "ray")
            and not whole_round_parts(c.planner) and _follows_up(c))


def _counts_successes(c: Config) -> bool:
    """Whether a part of the planner decides by successes (reward >= planner.success_threshold): the parts that
    read the estimator's belief, GRESO's skips, AR3PO's and DARS's extra samples, and replay."""
    from rollwise.planner.strategies import BELIEF_ALLOCATORS, BELIEF_SELECTORS, part

    pl = c.planner
    sel, alloc = part(pl, "selector"), part(pl, "allocator")
    return ((sel in BELIEF_SELECTORS and pl.candidate_factor > 1) or sel == "skip"
            or alloc in (*BELIEF_ALLOCATORS, "staged", "hardness") or part(pl, "repair") == "replay")


def _grows(c: Config) -> bool:
    """Whether a group may get more than rollout.num_generations samples (planner.max_samples_per_prompt unset
    or above it): at num_generations neither the screen allocator's growth nor DARS's extra samples happen."""
    top = c.planner.max_samples_per_prompt
    return top is None or top > c.rollout.num_generations


def _best_compared(c: Config) -> bool:
    """Whether an evaluation is compared with an earlier best: an early-stopping patience that can be reached,
    or eval.save_best with at least two evaluations (the first one is always the best)."""
    e = c.eval
    if c.data.eval_size == 0:
        return False
    return ((e.early_stopping_patience > 0 and _evals_before_end(c) > e.early_stopping_patience)
            or (e.save_best and _evals_before_end(c) + int(e.at_end) >= 2))


_GROWS_WHEN = ("planner.max_samples_per_prompt unset or above rollout.num_generations (at num_generations no group "
               "grows)")
_GRESO_BOUND_WHEN = ("planner.greso_explore_step > 0, or planner.greso_explore_init {} it (with a step of 0 the "
                     "exploration probabilities stay at greso_explore_init)")
# option -> (when it is read, that condition in words)
_READ_WHEN: dict[str, tuple[Any, str]] = {
    "model.cache_dir": (_builtin_model, "the built-in model as model.name_or_path"),
    "model.lora.r": (lambda c: c.model.lora.enabled, _LORA),
    "model.lora.alpha": (lambda c: c.model.lora.enabled, _LORA),
    "model.lora.dropout": (lambda c: c.model.lora.enabled, _LORA),
    "model.lora.target_modules": (lambda c: c.model.lora.enabled, _LORA),
    "data.system_prompt": (lambda c: c.data.use_chat_template, "data.use_chat_template=true"),
    "reward.overlong_penalty": (lambda c: c.reward.overlong_buffer > 0, "reward.overlong_buffer > 0"),
    "reward.overlong_buffer": (lambda c: c.reward.overlong_penalty > 0,
                               "reward.overlong_penalty > 0 (a penalty of 0 lowers no reward)"),
    "rollout.prompts_per_step": (lambda c: c.planner.budget_rollouts is None and c.planner.budget_tokens is None,
                                 "no planner.budget_rollouts or budget_tokens (a budget sets the step's size)"),
    "rollout.batch_size": (lambda c: c.rollout.engine != "vllm", "rollout.engine=hf or continuous"),
    "rollout.partial_stop_fraction": (lambda c: c.rollout.partial_rollouts, "rollout.partial_rollouts=true"),
    "rollout.retention_limit": (_carries, _CARRIES),
    "rollout.partial_keep_kv": (lambda c: c.rollout.engine == "continuous" and (_carries(c) or _in_flight_updates(c)),
                                f"rollout.engine=continuous and {_CARRIES} or {_IN_FLIGHT} (weights that change "
                                "while sequences are in flight; vLLM never keeps a KV cache across rounds)"),
    "rollout.spec_lenience": (lambda c: c.rollout.speculative_reuse, "rollout.speculative_reuse=true"),
    "rollout.spec_topk": (lambda c: c.rollout.speculative_reuse, "rollout.speculative_reuse=true"),
    "rollout.num_slots": (lambda c: c.rollout.engine == "continuous", "rollout.engine=continuous"),
    "rollout.transpose_weights": (lambda c: c.rollout.engine != "vllm",
                                  "rollout.engine=hf or continuous in training (vLLM keeps its own weight layout), "
                                  "and by `rollwise eval`"),
    "rollout.overlap_rounds": (_overlaps, "a planner that asks for follow-up rounds within a step (adaptive's "
                               "probe top-ups and growth with planner.screen_followup=same_step, ar3po's stages with "
                               "planner.ar3po_stages > 1), on the continuous or vllm engine in the synchronous loop "
                               "without partial rollouts (dapo's and dars's extra rounds are decided from a whole "
                               "round; the other planners ask for all of a step's samples at once: nothing to "
                               "overlap)"),
    "rollout.vllm_gpu_memory_utilization": (lambda c: c.rollout.engine == "vllm", "rollout.engine=vllm"),
    "algo.tis_cap": (lambda c: c.algo.offpolicy_correction == "tis", "algo.offpolicy_correction=tis"),
    "algo.decoupled_cap": (lambda c: c.algo.offpolicy_correction == "decoupled", "algo.offpolicy_correction=decoupled"),
    "algo.m2po_tau": (lambda c: c.algo.offpolicy_correction == "m2po", "algo.offpolicy_correction=m2po"),
    "algo.icepop_low": (lambda c: c.algo.offpolicy_correction == "icepop", "algo.offpolicy_correction=icepop"),
    "algo.icepop_high": (lambda c: c.algo.offpolicy_correction == "icepop", "algo.offpolicy_correction=icepop"),
    "algo.icepop_weighted": (lambda c: c.algo.offpolicy_correction == "icepop", "algo.offpolicy_correction=icepop"),
    "algo.kl_estimator": (lambda c: c.algo.beta > 0, "algo.beta > 0"),
    "algo.scale_rewards": (lambda c: c.algo.advantage == "grpo", "algo.advantage=grpo"),
    "algo.dual_clip": (lambda c: c.algo.policy_loss == "ppo_clip" and c.algo.num_iterations > 1,
                       "algo.policy_loss=ppo_clip and algo.num_iterations > 1" + _ONE_UPDATE),
    "algo.epsilon": (lambda c: c.algo.num_iterations > 1 and (c.algo.policy_loss != "cispo" or c.algo.epsilon_high is None),
                     "algo.num_iterations > 1, and a policy loss other than cispo or cispo without algo.epsilon_high"
                     + _ONE_UPDATE),
    "algo.epsilon_high": (lambda c: c.algo.num_iterations > 1, "algo.num_iterations > 1" + _ONE_UPDATE),
    "algo.policy_loss": (lambda c: c.algo.num_iterations > 1,
                         "algo.num_iterations > 1 (with one update per batch every token's ratio is exactly 1, where "
                         "GSPO's and CISPO's gradients are ppo_clip's)"),
    "train.lr_scheduler": (lambda c: c.train.warmup_steps < c.train.max_steps * c.algo.num_iterations,
                           "train.warmup_steps below train.max_steps x algo.num_iterations (the decay follows the "
                           "warm-up)"),
    "distributed.max_staleness": (lambda c: c.distributed.async_training, "distributed.async_training=true"),
    "distributed.weight_sync_tokens": (_in_flight_updates, _IN_FLIGHT),
    "distributed.worker_threads": (lambda c: c.distributed.backend == "ray",
                                   "distributed.backend=ray (local workers are threads of this process)"),
    "distributed.ray_address": (lambda c: c.distributed.backend == "ray", "distributed.backend=ray"),
    "distributed.max_worker_restarts": (lambda c: c.distributed.backend == "ray", "distributed.backend=ray"),
    "distributed.worker_gpus": (lambda c: c.distributed.backend == "ray" and (c.model.device == "cuda"
                                                                               or c.rollout.engine == "vllm"),
                                "distributed.backend=ray and a GPU engine (model.device=cuda or rollout.engine=vllm)"),
    "distributed.worker_timeout": (lambda c: c.distributed.backend == "ray", "distributed.backend=ray"),
    "planner.length_ema": (lambda c: c.planner.budget_tokens is not None, "planner.budget_tokens"),
    "planner.seed": (_planner_draws, "a planner with random choices: selector skip or posterior, or the screen "
                     "allocator with an estimator other than irt"),
    "planner.stratify": (lambda c: len(c.data.tasks) > 1, "more than one task in data.tasks (with one, its share "
                         "of the selected prompts is all of them: the top-scored candidates are chosen either way)"),
    "planner.stratify_rollouts": (lambda c: len(c.data.tasks) > 1 and _grows(c),
                                  "more than one task in data.tasks (with one, its share of the budget is the step's "
                                  f"budget) and {_GROWS_WHEN}"),
    "planner.group_prior": (lambda c: len(c.data.tasks) > 1,
                            "more than one task in data.tasks (with one, the task's prior is the pool's)"),
    "planner.screen_growth": (_grows, _GROWS_WHEN),
    "planner.dars_schedule": (_grows, _GROWS_WHEN),
    "planner.vade_fast_decay": (lambda c: c.planner.vade_fast_weight > 0,
                                "planner.vade_fast_weight > 0 (the fast scale's share of the belief)"),
    "planner.vade_slow_decay": (lambda c: c.planner.vade_fast_weight < 1,
                                "planner.vade_fast_weight below 1 (the slow scale's share is 1 - vade_fast_weight)"),
    "planner.staged_rule": (lambda c: c.planner.ar3po_stages > 1,
                            "planner.ar3po_stages > 1 (the rule decides which prompts get another stage)"),
    "planner.greso_zero_variance_target": (lambda c: c.planner.greso_explore_step > 0,
                                           "planner.greso_explore_step > 0 (the target decides which way the "
                                           "exploration probabilities step)"),
    "planner.greso_explore_min": (lambda c: c.planner.greso_explore_step > 0
                                  or c.planner.greso_explore_init < c.planner.greso_explore_min,
                                  _GRESO_BOUND_WHEN.format("below")),
    "planner.greso_explore_max": (lambda c: c.planner.greso_explore_step > 0
                                  or c.planner.greso_explore_init > c.planner.greso_explore_max,
                                  _GRESO_BOUND_WHEN.format("above")),
    "eval.every_n_steps": (lambda c: c.data.eval_size > 0 and c.eval.every_n_steps < c.train.max_steps,
                           "data.eval_size > 0 (held-out items to evaluate on) and eval.every_n_steps below "
                           "train.max_steps (the last step's evaluation is eval.at_end's)"),
    "eval.early_stopping_patience": (lambda c: c.data.eval_size > 0 and _evals_before_end(c) > c.eval.early_stopping_patience,
                                     "data.eval_size > 0 and more evaluations before the last step than the patience "
                                     "(eval.at_start's and one every eval.every_n_steps steps below train.max_steps: "
                                     "the first sets the best, each later one that does not beat it counts): lower "
                                     "eval.early_stopping_patience or eval.every_n_steps"),
    "eval.pass_k": (_evaluates, "an evaluation (eval.at_start, at_end or every_n_steps, and data.eval_size > 0)"),
    "eval.batch_size": (lambda c: False, "`rollwise eval`; evaluation during training runs in the rollout engine "
                        "(rollout.batch_size, rollout.num_slots)"),
    "eval.max_completion_length": (_evaluates, "an evaluation (eval.at_start, at_end or every_n_steps, and "
                                   "data.eval_size > 0)"),
    "train.share_prompt_forward": (lambda c: not c.train.gradient_checkpointing,
                                   "train.gradient_checkpointing=false (gradient checkpointing turns the shared "
                                   "prompt forward off)"),
    "train.skip_zero_advantage": (lambda c: c.algo.beta == 0 and c.algo.entropy_coef == 0,
                                  "algo.beta=0 and algo.entropy_coef=0 (otherwise every sample is forwarded anyway)"),
    "algo.offpolicy_correction": (lambda c: c.algo.offpolicy_correction != "mask_resumed" or _carries(c)
                                  or _in_flight_updates(c),
                                  f"mask_resumed: {_CARRIES} or {_IN_FLIGHT} (only they leave tokens of an older "
                                  "version in a sample)"),
    "eval.save_best": (_evaluates, "an evaluation (eval.at_start, at_end or every_n_steps, and data.eval_size > 0)"),
    "eval.early_stopping_min_delta": (_best_compared,
                                      "an evaluation compared with an earlier best (data.eval_size > 0): an "
                                      "eval.early_stopping_patience that can be reached, or eval.save_best=true with "
                                      "at least two evaluations (eval.at_start, every_n_steps, at_end; the first is "
                                      "always the best)"),
}


def unused_settings(cfg: Config) -> list[str]:
    """One line per option set away from its default whose feature this config leaves off (it would be
    ignored): what `rollwise train` warns about before it starts."""
    out = []
    for key, (read, when) in _READ_WHEN.items():
        *path, name = key.split(".")
        sec = cfg
        for part in path:
            sec = getattr(sec, part)
        default = type(sec).model_fields[name].get_default(call_default_factory=True)
        if getattr(sec, name) != default and not read(cfg):
            out.append(f"{key}={getattr(sec, name)} has no effect: it is read only with {when}")
    tasks = cfg.data.tasks
    if len(tasks) == 1 and tasks[0].weight != 1.0:
        out.append(f"data.tasks[0].weight={tasks[0].weight} has no effect: a weight is a task's share of a mixture, and "
                   "this one has a single task")
    d = cfg.distributed
    if d.async_training and d.max_staleness > 0 and cfg.algo.offpolicy_correction == "recompute":
        out.append(f"distributed.max_staleness={d.max_staleness} lets batches be sampled up to {d.max_staleness} "
                   "versions before the trainer's weights, and algo.offpolicy_correction=recompute trains every token "
                   "as on-policy; set algo.offpolicy_correction=decoupled (or tis) to correct for it")
    if cfg.algo.policy_loss == "gspo" and cfg.algo.loss_type != "grpo":
        out.append(f"algo.policy_loss=gspo with algo.loss_type={cfg.algo.loss_type} weights each sequence by its number "
                   "of tokens; GSPO's objective averages sequences (each one's length-normalised ratio counts once): set "
                   "algo.loss_type=grpo, as verl and TRL do for GSPO")
    ro, weighted = cfg.rollout, cfg.algo.offpolicy_correction in ("tis", "decoupled", "m2po", "icepop")
    if ro.engine == "vllm" and (ro.top_p < 1 or ro.top_k > 0) and weighted:
        out.append(f"rollout.engine=vllm with rollout.top_p={ro.top_p:g}, top_k={ro.top_k} biases algo.offpolicy_correction="
                   f"{cfg.algo.offpolicy_correction}: vLLM records each token's log-prob in the top-k/top-p distribution "
                   "it was drawn from, the trainer in the full one, so every importance ratio is pulled below 1 by the "
                   "kept mass (offpolicy/behaviour_kl gets a floor of minus its log); use the continuous engine, "
                   "top_p=1 and top_k=0, or algo.offpolicy_correction=recompute")
    from rollwise.planner.strategies import belief_unread  # no config import

    unread = belief_unread(cfg.planner)
    if unread:
        out.append(unread)
    pl = cfg.planner
    from rollwise.planner.strategies import part

    if part(pl, "selector") == "skip" and pl.greso_hard_threshold >= pl.greso_easy_threshold:
        out.append(f"planner.greso_hard_threshold={pl.greso_hard_threshold:g} is not below planner.greso_easy_threshold="
                   f"{pl.greso_easy_threshold:g}: GRESO tests a visit for easy first, so a visit whose share of "
                   f"successful samples is from {pl.greso_easy_threshold:g} to {pl.greso_hard_threshold:g} counts as "
                   "easy, not hard; lower greso_hard_threshold below greso_easy_threshold")
    if pl.success_threshold != type(pl).model_fields["success_threshold"].default and not _counts_successes(cfg):
        out.append(f"planner.success_threshold={pl.success_threshold:g} decides which samples count as successes, "
                   f"which no part of strategy '{pl.strategy}' (selector '{part(pl, 'selector')}', allocator "
                   f"'{part(pl, 'allocator')}', repair '{part(pl, 'repair')}') reads: it changes only the metrics "
                   "planner/brier, planner/all_wrong_share and rollout/success_not_correct_frac")
    rewards = cfg.reward.functions
    if all(":" not in r.name for r in rewards):  # built-in functions score in [0, 1]; a user's may not
        top = sum(max(r.weight, 0.0) for r in rewards)
        if cfg.planner.success_threshold > top + 1e-9:
            out.append(f"planner.success_threshold={cfg.planner.success_threshold:g} is above the highest reward these "
                       f"reward functions can give ({top:g}: each scores at most 1): no sample would count as solved, "
                       f"so the planner would take every prompt for unsolved and replay nothing; set it to at most "
                       f"{top:g}")
    return out
