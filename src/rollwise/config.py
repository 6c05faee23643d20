"""One typed config for every command: YAML file + dotted command-line overrides.

Every field carries a one-line description; `rollwise options` prints them.
Unknown keys, wrong types and impossible values fail here, before any model is loaded,
with a message that names the key and what is allowed.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

# a file or folder option: `~` is expanded (a YAML file never expands it, nor does the shell after `KEY=`)
PathStr = Annotated[str, AfterValidator(os.path.expanduser)]


class ConfigError(ValueError):
    """A config problem the user must fix; the message says what and how."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML reads true/false, yes/no and on/off as booleans, which pydantic takes as 1 and 0 for a number
        (train.max_steps=true trained one step)."""
        if isinstance(value, bool) and info.field_name is not None:
            ann = cls.model_fields[info.field_name].annotation
            kinds = {ann, *get_args(ann)}
            if bool not in kinds and kinds & {int, float}:
                raise ValueError("a number is needed, not a boolean (YAML reads true/false, yes/no and on/off as one)")
        return value


class LoraConfig(_Section):
    enabled: bool = Field(False, description="Train LoRA adapters (peft) instead of all weights.")
    r: int = Field(16, gt=0, description="LoRA rank.")
    alpha: int = Field(32, gt=0, description="LoRA alpha (scaling = alpha / r).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout. The update's forward passes draw their own "
                           "masks and the engine generates without it, so with algo.num_iterations > 1 the policy ratio "
                           "carries dropout noise.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names that receive adapters.",
    )


class ModelConfig(_Section):
    name_or_path: str = Field(
        "smollm2-135m",
        description="Built-in name (smollm2-135m), a local Hugging Face folder, or a hub id.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Compute dtype for generation and forward/backward; master weights and "
        "optimizer state stay float32. auto: bfloat16 on a GPU with bf16 and on a CPU with a bf16 instruction "
        "(AVX512_BF16, AMX-BF16, Arm BF16), float32 elsewhere (emulated bf16 trained 2.4x slower on AVX-512 without "
        "AVX512_BF16 and 28x slower on an AVX2-only CPU).",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Where the trainer (and the hf/continuous engines) run. cuda has run on one H200 "
        "(bench/gpu_planner.sh: training, resume, eval); CI has no GPU, so no test covers it.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters.")
    cache_dir: PathStr | None = Field(
        None, description="Where built-in models are converted to (default $ROLLWISE_CACHE, else "
        "~/.cache/rollwise)."
    )


class TaskSpec(_Section):
    name: str = Field(description="reasoning-gym generator name, or a label for a file task.")
    path: PathStr | None = Field(None, description="Local .jsonl/.json/.parquet/.csv file; makes this a file task.")
    weight: float = Field(1.0, gt=0, description="Share of this task in the mixture.")
    params: dict[str, Any] = Field(default_factory=dict, description="Generator parameters (reasoning-gym).")
    prompt_column: str = Field("prompt", description="File column holding the question: text, or a conversation "
                               "(a list of {role, content} messages, as TRL's datasets hold), whose last user message "
                               "is taken.")
    answer_column: str = Field("answer", description="File column holding the gold answer.")

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> TaskSpec:
        """A file task's generator parameters, or a generator task's column names, would be ignored."""
        if self.path is not None and self.params:
            raise ValueError(f"task '{self.name}' reads the file {self.path}; params apply to reasoning-gym "
                             "generators only (drop params, or drop path to generate the task)")
        cols = [k for k in ("prompt_column", "answer_column") if getattr(self, k) != type(self).model_fields[k].default]
        if self.path is None and cols:
            raise ValueError(f"task '{self.name}' is generated by reasoning-gym; {' and '.join(cols)} "
                             f"appl{'y' if len(cols) > 1 else 'ies'} to file tasks only (give path, or drop "
                             f"{'them' if len(cols) > 1 else 'it'})")
        return self


DEFAULT_TASKS: list[dict[str, Any]] = [
    {"name": "chain_sum", "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}},
    {"name": "products", "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}},
    # no division: with allow_parentheses=false reasoning-gym (0.1.25) rewrites a division after writing its
    # question, so 100 of 103 division items in 400 had a wrong gold answer ("Calculate 4 / 1." -> 2)
    {"name": "basic_arithmetic", "params": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                                            "allow_negation": False, "allow_parentheses": False,
                                            "operators": ["+", "-", "*"]}},
    {"name": "gcd", "params": {"min_value": 1, "max_value": 99}},
    {"name": "lcm", "params": {"min_value": 1, "max_value": 20}},
]

DEFAULT_INSTRUCTION = ""


class DataConfig(_Section):
    tasks: list[TaskSpec] = Field(
        default_factory=lambda: [TaskSpec(**t) for t in DEFAULT_TASKS], min_length=1,
        description="Task mixture: reasoning-gym generators and/or local files.",
    )
    train_size: int = Field(4000, gt=0, description="Procedural training items drawn from the mixture.")
    eval_size: int = Field(300, ge=0, description="Held-out evaluation items (never overlap training); a file task "
                           "holds out its share of them but at most 20% of its rows (none of a file of 4 rows or fewer).")
    instruction: str = Field(DEFAULT_INSTRUCTION, description="Appended to every question (for example the answer format).")
    system_prompt: str | None = Field(None, description="Optional system message for chat models.")
    use_chat_template: bool = Field(True, description="Wrap prompts with the tokenizer's chat template.")
    max_prompt_length: int = Field(256, gt=0, description="Prompts longer than this (tokens) are dropped and counted.")


RewardName = str


class RewardSpec(_Section):
    name: RewardName = Field(
        description="reasoning_gym | math_verify | exact_match | format | module:function | path/to/file.py:function"
    )
    weight: float = Field(1.0, description="Weight in the summed reward.")

    @model_validator(mode="after")
    def _known(self) -> RewardSpec:
        builtin = {"reasoning_gym", "math_verify", "exact_match", "format"}
        if self.name not in builtin and ":" not in self.name:
            raise ValueError(
                f"unknown reward '{self.name}'; allowed: {', '.join(sorted(builtin))}, 'module:function' or "
                "'path/to/file.py:function'"
            )
        return self


class RewardConfig(_Section):
    functions: list[RewardSpec] = Field(
        default_factory=lambda: [RewardSpec(name="reasoning_gym", weight=1.0)], min_length=1,
        description="Reward functions and weights; the reward is their weighted sum. The first one also decides "
        "which samples count as correct (held-out accuracy, pass@k, `rollout/accuracy`, `rollout/groups`): a sample it "
        "scores 1. The planner and the replay bank read the total reward instead (planner.success_threshold).",
    )
    # the reward worker is waited on with Connection.poll, whose milliseconds must fit a C int (about 24.8 days)
    timeout: float = Field(5.0, gt=0, le=1e6, description="Seconds one reward call may take before it scores 0 "
                           "(at most 1e6).")
    truncated_reward: float | None = Field(
        None, description="The reward of a training sample cut at rollout.max_completion_length, in place of its "
        "score (SIRI's rule is 0): an answer cut mid-way that happens to end on the right number then teaches "
        "nothing. Its reward functions' parts become 0, so it counts as wrong in rollout/accuracy and "
        "rollout/groups, and the planner and the replay bank treat it as a failure unless its reward is at least "
        "planner.success_threshold: the value, less reward.overlong_penalty where reward.overlong_buffer > 0 (a cut "
        "sample is at the cap). null: scored as written. Held-out evaluation always scores answers as written.")
    overlong_buffer: int = Field(
        0, ge=0, description="DAPO's soft overlong punishment: a training sample longer than "
        "rollout.max_completion_length - overlong_buffer tokens loses overlong_penalty x (its excess / the buffer) "
        "of reward, up to overlong_penalty at the cap (verl's overlong_buffer.len). 0: off. Correctness (the "
        "first reward function's score) and held-out evaluation are unchanged; the planner's success rule "
        "(reward >= planner.success_threshold) reads the lowered reward.")
    overlong_penalty: float = Field(1.0, ge=0, description="The reward a sample at the cap loses under "
                                    "reward.overlong_buffer (verl's penalty_factor).")


class RolloutConfig(_Section):
    prompts_per_step: int = Field(8, gt=0, description="Prompts drawn per training step.")
    num_generations: int = Field(8, gt=0, description="Samples per prompt (the group size, TRL's name).")
    max_completion_length: int = Field(48, gt=0, description="Maximum new tokens per sample.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1.0, description="Nucleus sampling threshold. Tokens are drawn from the "
                         "truncated distribution; the hf and continuous engines record (and the trainer computes) "
                         "log-probs of the full one, vLLM of the truncated one, and no off-policy correction "
                         "accounts for the truncation.")
    top_k: int = Field(0, ge=0, description="Top-k sampling (0 = off); log-probs as for top_p.")
    batch_size: int = Field(64, gt=0, description="Sequences generated together in one batch (hf engine); "
                            "the most prompts prefilled in one forward (continuous engine).")
    engine: Literal["hf", "continuous", "vllm"] = Field(
        "continuous", description="Generation engine: continuous keeps `num_slots` sequences decoding and refills a "
        "slot as soon as its sequence ends; hf decodes static batches of `batch_size`; vllm (GPU, pip install "
        "'/path/to/rollwise[vllm]', experimental) runs vLLM in this process or in each rollout worker.")
    vllm_gpu_memory_utilization: float = Field(
        0.3, gt=0, le=1.0, description="engine=vllm: share of the GPU's memory vLLM may take (leave room for the "
        "trainer when they share a GPU).")
    engine_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Dtype the generation engine computes in. auto: model.dtype, or float32 with "
        "speculative_reuse (in bf16 its one-pass verification and token-by-token decoding round differently).")
    transpose_weights: bool | None = Field(
        None, description="Store the engine's copy of the linear weights input-major ([in, out] in memory; same values, "
        "results equal up to fp32 rounding). On a CPU in float32 this takes MKL's faster path for products with few "
        "rows: a decode step 1.4-1.5x faster at 4-32 sequences (0.9-1.1x at 1 and 64), adaptive's generation 1.30-1.49x "
        "the tokens/s and uniform's 1.23-1.28x on the development machine (bench/engine_layout.py); each weight sync "
        "takes about 0.2 s more. Unset: on for the hf and continuous engines on a CPU in float32 (bf16 was measured "
        "no faster); true: always (hf and continuous engines); false: off.")
    num_slots: int | None = Field(None, gt=0, description="Sequences decoding together in the continuous engine "
                                  "(default: batch_size).")
    partial_rollouts: bool = Field(
        False, description="APRIL: end a step's first round once partial_stop_fraction of its groups have finished; "
        "unfinished samples are carried, tokens and log-probs kept, into the next step, first in line "
        "(needs engine=continuous). Pair with algo.offpolicy_correction for their older tokens.")
    partial_stop_fraction: float = Field(
        0.75, gt=0, le=1.0, description="Partial rollouts: the first round of a step ends once this share of its "
        "groups (carried ones included) has finished; the rest is carried. 0.75 trains about prompts_per_step groups "
        "a step and carries a third as many; 1 turns carrying off.")
    partial_keep_kv: bool = Field(
        False, description="Partial rollouts, or asynchronous training's in-flight weight updates: sequences carried "
        "or in flight keep their KV cache in the engine across the weight update instead of prefilling prompt + "
        "prefix again under the new weights (PipelineRL's in-flight update; on "
        "a CPU a prefill costs nearly as much as decoding). Their later tokens attend to keys of older weights; the "
        "recorded behaviour log-probs are what was sampled. The held KV is not checkpointed, so a resumed run "
        "re-prefills and is not bit-identical.")
    overlap_rounds: bool | None = Field(
        None, description="Follow-up rounds of a multi-round planner (adaptive's probe top-ups and growth, ar3po's "
        "stages) join the running engine batch as soon as their group has finished and been scored, instead of "
        "starting after the slowest response of the round. Unset: on wherever it can be (engine=continuous or vllm, "
        "no partial_rollouts, the synchronous loop, a planner that decides group by group: not dapo or dars) and "
        "the planner asks for follow-ups at all (adaptive, ar3po); true: required (an error says what prevents "
        "it); false: round by round. Which informative groups grow first then follows the order in which groups "
        "finish; probes still out keep the budget their top-ups may need.")
    retention_limit: int = Field(
        2, ge=0, description="Partial rollouts: a carried sample whose oldest token is more than this many policy "
        "versions old is dropped (and counted in rollout/dropped_stale).")
    speculative_reuse: bool = Field(
        False, description="SPEC-RL: when a prompt comes back, verify its previous responses under the current "
        "policy, keep the accepted prefix and generate only the rest (needs engine=continuous). The engine then "
        "runs in fp32 (rollout.engine_dtype=auto): in bf16 decoding and verification round differently and reject "
        "tokens for nothing. Caution: the policy has been trained on the responses it verifies, so it keeps the "
        "ones it was rewarded for far more often than a fresh sample would (bench/spec_memorization.py); on a small "
        "prompt set revisited every few steps this cost 7-8.5 points of held-out accuracy, and keeping only responses "
        "that got no gradient still cost 4.5 (bench/RESULTS.md).")
    spec_lenience: float = Field(
        1.0, gt=0, description="Speculative reuse: accept an old token with probability "
        "min(1, lenience * p_new / p_old). 1 is exact (the output follows the current policy); SPEC-RL uses e^0.5, "
        "which in bench/spec_reuse.py kept 70-80% of old tokens and froze the rollouts: held-out accuracy fell.")
    spec_topk: int = Field(
        32, gt=0, description="Speculative reuse: old-distribution probabilities kept per token for the residual "
        "resampling at the first rejected token (exact when they hold all the mass).")


class AlgoConfig(_Section):
    advantage: Literal["grpo", "rloo", "reinforce_pp"] = Field(
        "grpo", description="Advantage estimator: grpo (group mean), rloo (leave-one-out), "
        "reinforce_pp (group baseline, batch whitening)."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Divide GRPO advantages by the group std, the batch std, or not (Dr.GRPO)."
    )
    policy_loss: Literal["ppo_clip", "gspo", "cispo"] = Field(
        "ppo_clip", description="Per-token PPO clip, GSPO (sequence ratio) or CISPO. GSPO and CISPO differ from "
        "ppo_clip only with algo.num_iterations > 1 (one update per batch leaves every ratio at 1); GSPO's objective "
        "averages sequences, which is algo.loss_type=grpo."
    )
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = Field(
        "dapo", description="Aggregation: grpo = mean of per-sequence token means, dapo = token mean, "
        "dr_grpo = token sum / (sequences x max_completion_length)."
    )
    epsilon: float = Field(0.2, gt=0, lt=1, description="Lower clip range (ratio >= 1 - epsilon); acts only with "
                           "algo.num_iterations > 1 (one update per batch leaves every ratio at 1).")
    epsilon_high: float | None = Field(None, gt=0, description="Upper clip range; None = epsilon (DAPO uses 0.28); acts "
                                       "only with algo.num_iterations > 1. With policy_loss=cispo the importance "
                                       "weight's cap is 1 + epsilon_high (TRL's epsilon_high is the cap itself: 4 here is "
                                       "TRL's 5).")
    dual_clip: float | None = Field(None, gt=1, description="Dual-clip bound c for negative advantages (None = off); "
                                    "acts only with algo.num_iterations > 1.")
    beta: float = Field(0.0, ge=0, description="KL coefficient against a frozen reference model (0 = none "
                      "loaded): a copy of the starting policy's weights, as large as the policy's (float32), run in "
                      "model.dtype like the policy; with LoRA the base model with adapters off (no copy).")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator used when beta > 0.")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    mask_truncated_completions: bool = Field(False, description="Exclude samples cut at max_completion_length from the loss.")
    num_iterations: int = Field(1, gt=0, description="Clipped updates per generated batch (PPO epochs, TRL's mu).")
    offpolicy_correction: Literal["recompute", "mask_resumed", "tis", "decoupled", "m2po", "icepop"] = Field(
        "recompute", description="Off-policy correction against the engine's behaviour log-probs: recompute "
        "(treat every token as on-policy), mask_resumed (train only on tokens of the newest version in each "
        "sample), tis (truncated importance weights), decoupled (AReaL's decoupled PPO), m2po (second-moment "
        "masking; pair it with wide clip ranges), icepop (mask tokens whose ratio leaves a band)."
    )
    tis_cap: float = Field(2.0, gt=0, description="tis: cap C on the importance weight min(pi_prox / pi_behav, C).")
    decoupled_cap: float | None = Field(
        None, gt=0, description="decoupled: cap on the weight pi_prox / pi_behav (None = uncapped, as in AReaL)."
    )
    m2po_tau: float = Field(
        0.04, ge=0, description="m2po: keep the most tokens whose mean squared log-ratio to the behaviour "
        "policy stays <= tau (per micro-batch)."
    )
    icepop_low: float = Field(0.5, gt=0, description="icepop: mask tokens with pi_prox / pi_behav below this.")
    icepop_high: float = Field(2.0, gt=0, description="icepop: mask tokens with pi_prox / pi_behav above this.")
    icepop_weighted: bool = Field(
        True, description="icepop: weight kept tokens by pi_prox / pi_behav (false: a pure mask)."
    )


class TrainConfig(_Section):
    max_steps: int = Field(40, gt=0, description="Training steps (one step = one generated batch).")
    max_rollout_tokens: int | None = Field(
        None, gt=0, description="Also stop once this many response tokens were generated (a rollout budget)."
    )
    learning_rate: float = Field(3e-5, gt=0, description="Peak AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1.")
    adam_beta2: float = Field(0.99, ge=0, lt=1, description="AdamW beta2.")
    warmup_steps: int = Field(2, ge=0, description="Optimizer steps of linear warm-up.")
    lr_scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Decay after warm-up, to 0 at the end of the run: after train.max_steps x "
        "algo.num_iterations updates or, with train.max_rollout_tokens, once that many tokens are generated, "
        "whichever comes first (a token budget that ends the run within the warm-up is warned about when it stops).")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient-norm clip.")
    micro_batch_size: int = Field(16, gt=0, description="Sequences per forward/backward (bounds memory).")
    logprob_chunk: int = Field(1024, gt=0, description="Tokens per chunk when gathering log-probs.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations to save memory.")
    share_prompt_forward: bool = Field(
        True, description="Run each distinct prompt of a micro-batch through the model once and let its samples' "
        "responses attend to its keys and values, instead of one prompt+response sequence per sample. Same loss "
        "and gradient up to float rounding, less work when prompts are long against responses; off where the "
        "model's cache cannot be shared (sliding windows) or with gradient_checkpointing."
    )
    skip_zero_advantage: bool = Field(
        True, description="Do not forward samples whose advantage is exactly 0 when nothing else needs them."
    )
    disable_dropout: bool = Field(
        False, description="Set the policy's dropout to 0 while it trains (TRL's disable_dropout). The engine and "
        "the reference model run without dropout, so with it on the update's log-probs carry noise the sampled ones "
        "do not. LoRA's own dropout (model.lora.dropout) is kept. Most recent LLMs have no dropout."
    )


PlannerStrategy = Literal["uniform", "dapo", "greso", "mopps", "vade", "knapsack", "dars", "ar3po", "e3", "adaptive"]


class PlannerConfig(_Section):
    strategy: PlannerStrategy = Field(
        "adaptive", description="Rollout planning preset: adaptive (ours, the default), uniform (TRL's fixed group per prompt), "
        "dapo, greso, mopps, vade, knapsack, dars, ar3po, e3."
    )
    estimator: Literal["beta", "two_scale_beta", "window", "last_visit", "rank", "irt"] | None = Field(
        None, description="Solve-rate estimator part (None = the strategy's own)."
    )
    selector: Literal["all", "skip", "posterior", "filter"] | None = Field(
        None, description="Prompt selector part (None = the strategy's own)."
    )
    allocator: Literal["fixed", "knapsack", "staged", "hardness", "rank", "screen"] | None = Field(
        None, description="Samples-per-prompt allocator part (None = the strategy's own)."
    )
    repair: Literal["none", "replay"] | None = Field(
        None, description="Repair for all-wrong groups: replay a past correct response (None = the strategy's own)."
    )
    budget_rollouts: int | None = Field(
        None, gt=0, description="Rollouts per step (None = prompts_per_step * num_generations)."
    )
    budget_tokens: int | None = Field(
        None, gt=0, description="Response tokens per step instead of a rollout budget (over- or under-spending carried to "
        "the next step, at most one step's budget either way; DAPO's back-fill can exceed it every step)."
    )
    min_samples_per_prompt: int | None = Field(
        None, gt=0, description="knapsack and rank (e3) allocators: fewest samples a rolled-out prompt gets "
        "(None = strategy default: knapsack 2, e3 num_generations/2)."
    )
    max_samples_per_prompt: int | None = Field(
        None, gt=0, description="Most samples one prompt gets in a step (None = strategy default: screen (adaptive) "
        "2x, knapsack 16x, e3 1.5x, dars et 4x / hw 8x num_generations; for adaptive and dars, which give a prompt "
        "num_generations before they add any, at least num_generations)."
    )
    success_threshold: float = Field(
        0.5, description="A reward at or above this counts as a success (the planner's belief, "
        "and the responses replay may reuse; correct is the first reward function's 1, rollout/accuracy). `rollwise "
        "train` warns when it is above the highest total reward the "
        "built-in reward functions can give.")
    posterior_decay: float = Field(
        1.0, gt=0, le=1, description="beta (MoPPS) and irt estimators: decay lambda, alpha <- lambda*alpha + (1-lambda) + "
        "successes (1 = no decay)."
    )
    vade_fast_decay: float = Field(0.5, gt=0, le=1, description="VADE fast-scale posterior decay.")
    vade_slow_decay: float = Field(0.95, gt=0, le=1, description="VADE slow-scale posterior decay.")
    vade_fast_weight: float = Field(0.5, ge=0, le=1, description="Weight of the fast scale in VADE's blended posterior.")
    estimator_window: int = Field(16, gt=0, description="Rewards kept per prompt by the window/last-visit/rank estimators.")
    min_observations: int = Field(8, ge=0, description="Knapsack: prompts with fewer observed rewards get num_generations.")
    group_prior: bool = Field(
        True, description="irt: a prior per task (the prompt uid's prefix before ':'), shrunk toward the pool's, so an "
        "unseen prompt of a task that is hard today looks hard."
    )
    length_prior: bool = Field(
        False, description="irt: an unseen prompt's prior also shifts with its token length within its task (a slope "
        "per task learned from the prompts seen so far); in the default mixture a prompt's length explains 38% of the "
        "spread of solve rates that its task does not (bench/prior_features.py)."
    )
    target_solve_rate: float = Field(0.5, gt=0, lt=1, description="MoPPS: solve rate the posterior sampling aims at.")
    selection_score: Literal["target", "info", "expected"] | None = Field(
        None, description="Posterior selector score: target = Thompson draw near target_solve_rate (MoPPS), info = "
        "Thompson draw of P(informative)*p(1-p)^2 (VADE), expected = posterior-expected gradient signal "
        "(None = strategy default)."
    )
    candidate_factor: float = Field(
        8.0, ge=1, description="MoPPS/VADE: candidate prompts scored per selected prompt (MoPPS: 8-16)."
    )
    stratify: bool | None = Field(
        None, description="Posterior selector: keep each task's share of the selected prompts equal to its share of "
        "the candidates (the data mixture), choosing the best-scored within each task (None = strategy default: "
        "adaptive yes, mopps/vade no)."
    )
    stratify_rollouts: bool | None = Field(
        None, description="Screen allocator: a task's extra samples (growth of informative groups beyond "
        "num_generations) stop once the task has spent its share of the step's rollout budget, its share being "
        "that of the step's selected prompts; top-ups of probes to a full group are not capped "
        "(None = strategy default: adaptive yes)."
    )
    filter_zero_variance: bool | None = Field(
        None, description="Drop groups with equal rewards from training (None = strategy default: dapo, dars)."
    )
    dapo_max_rounds: int = Field(10, gt=0, description="DAPO: most generation rounds per step (verl max_num_gen_batches).")
    dapo_oversample: float = Field(
        1.0, ge=1, description="DAPO: prompts generated per missing informative group in each round (DAPO's recipe: 3)."
    )
    greso_explore_init: float = Field(0.5, gt=0, le=1, description="GRESO: initial exploration probability p_easy = p_hard.")
    greso_explore_step: float = Field(0.01, ge=0, description="GRESO: per-step adjustment of the exploration probabilities.")
    greso_explore_min: float = Field(0.05, ge=0, le=1, description="GRESO: lower clip of the exploration probabilities.")
    greso_explore_max: float = Field(0.95, ge=0, le=1, description="GRESO: upper clip of the exploration probabilities.")
    greso_zero_variance_target: float = Field(
        0.25, ge=0, le=1, description="GRESO: target zero-variance share (1/3 easy, 2/3 hard)."
    )
    greso_easy_threshold: float = Field(0.98, ge=0, le=1, description="GRESO: a visit whose share of successful samples is >= this counts as easy.")
    greso_hard_threshold: float = Field(0.11, ge=0, le=1, description="GRESO: a visit whose share of successful samples is <= this counts as hard.")
    ar3po_stages: int = Field(4, gt=0, description="AR3PO: most sampling stages per prompt.")
    ar3po_stage_size: int | None = Field(
        None, gt=0, description="AR3PO: responses per stage (None = num_generations // 2)."
    )
    staged_rule: Literal["until_correct", "while_informative"] = Field(
        "until_correct", description="Staged allocator: continue a prompt until it has a correct response (AR3PO), "
        "or only while its group is informative (probe, then commit)."
    )
    screen_size: int = Field(2, gt=0, description="Screen allocator: samples in the probe of a prompt whose belief "
                             "expects an all-equal group.")
    screen_threshold: float = Field(
        0.3, ge=0, le=1, description="Screen allocator: probe a prompt first when its belief gives P(all samples "
        "equal) at least this."
    )
    screen_growth: Literal["stages", "eager"] = Field(
        "stages", description="Screen allocator: an informative group grows by num_generations/2 per round up to "
        "max_samples_per_prompt (stages), or in one request as far as the budget allows, a probe that is already "
        "informative together with its top-up (eager: fewer dependent rounds, the same rule)."
    )
    screen_followup: Literal["same_step", "next_step"] = Field(
        "same_step", description="Screen allocator: a surprising probe is topped up to a full group in the same "
        "step (same_step), or rolled out in full in the next step, so that every step is one round (next_step)."
    )
    dars_schedule: Literal["et", "hw"] = Field(
        "et", description="DARS: extra-rollout schedule, et (equal treatment) or hw (hardness weighted)."
    )
    length_ema: float = Field(0.1, gt=0, le=1, description="EMA weight of the response-length estimate used for token budgets "
                              "(the plain mean of the steps seen while 1/steps is larger).")
    revisit_cooldown: int = Field(
        0, ge=0, description="Steps after the one in which a prompt was trained on with a gradient during which it "
        "is not selected (0 = no limit, 1 = not in the very next step). Spreads training over more prompts: "
        "without it `adaptive` returns to the same few informative prompts step after step. A pool too small for "
        "it gives back the prompts cooled longest.")
    revisit_discount: float = Field(
        1.0, gt=0, le=1, description="Posterior selector: a prompt already trained on with a gradient k times is "
        "scored at revisit_discount^k of its score (1 = no discount). A soft form of revisit_cooldown: three "
        "studies found a retrained prompt teaches the held-out items less than a new one (bench/RESULTS.md).")
    score_per_token: bool = Field(
        False, description="Posterior selector: divide each candidate's score by its expected response length (the "
        "mean length of its samples when last rolled out; a candidate not yet rolled out gets the mean of this step's "
        "candidates that were), so selection ranks by gradient signal per generated token instead of per rollout. Prefers prompts "
        "the model answers briefly, and so spends fewer tokens a step.")
    prior_counts: PathStr | None = Field(
        None, description="Path to a JSONL file of solve counts measured before training, one row per prompt: "
        '{"uid": ..., "successes": S, "samples": N} (bench/pool_rates.py writes one for a run\'s pool). The '
        "planner's estimator starts as if each listed prompt had been rolled out N times with S correct; those "
        "rollouts are not counted in the run's budget. Only strategies whose parts read the estimator take it "
        "(mopps, vade, knapsack, e3, adaptive). Rows for prompts outside the pool are ignored; a file with none "
        "in the pool is an error. A resumed run takes the belief from its checkpoint, not from the file.")
    seed: int | None = Field(
        None, ge=0, lt=2**32, description="Seed of the planner's own random choices (posterior draws, skip draws, quota draws); "
        "None: run.seed. Changing it alone keeps the data order and the engine's sampling seed, so repeats of one "
        "run.seed measure how much a run moves by the planner's draws alone.")


class EvalConfig(_Section):
    every_n_steps: int = Field(0, ge=0, description="Evaluate every N steps (0 = only before and after).")
    at_start: bool = Field(True, description="Evaluate before training.")
    at_end: bool = Field(True, description="Evaluate after training.")
    batch_size: int = Field(64, gt=0, description="Sequences per evaluation batch of `rollwise eval`; evaluation during "
                            "training runs in the rollout engine (rollout.batch_size, rollout.num_slots).")
    pass_k: int = Field(0, ge=0, description="Also report pass@k with k sampled answers (0 = off).")
    max_completion_length: int | None = Field(None, gt=0, description="None = rollout.max_completion_length.")
    save_best: bool = Field(
        False, description="Keep the weights of the best eval/accuracy seen so far (evaluations before, during and "
        "after training) in <run>/checkpoints/best, with best.json naming its step; rollwise eval and rollwise export "
        "take that folder. It is chosen on the held-out items, so its accuracy there is optimistic.")
    early_stopping_patience: int = Field(
        0, ge=0, description="Stop training once this many evaluations in a row have not beaten the best "
        "eval/accuracy by more than early_stopping_min_delta (0 = never; needs every_n_steps).")
    early_stopping_min_delta: float = Field(
        0.0, ge=0, description="How much an evaluation must beat the best eval/accuracy by to count as a new best.")


class RunConfig(_Section):
    output_dir: PathStr = Field("runs", description="Parent folder of run folders.")
    name: str | None = Field(None, description="Run folder name (default: a timestamp).")
    seed: int = Field(0, ge=0, lt=2**32, description="One seed for data order, sampling and the planner.")
    save_every: int = Field(5, ge=0, description="Checkpoint every N steps (0 = only at the end).")
    keep_checkpoints: int = Field(2, gt=0, description="Checkpoints kept on disk.")
    torch_threads: int | None = Field(None, gt=0, description="torch threads (None = OMP_NUM_THREADS where it is set, at most the "
                                       "cores this process may use, else all of those; the trainer actor of a "
                                       "distributed.backend=ray run takes 1).")
    progress: bool = Field(True, description="Show a progress bar.")
    tensorboard: bool = Field(True, description="Write TensorBoard events.")

    @model_validator(mode="after")
    def _name_inside_output_dir(self) -> RunConfig:
        if self.name is not None and (not self.name.strip() or os.path.isabs(self.name)
                                      or ".." in Path(self.name).parts):
            raise ValueError(f"run.name={self.name!r} must name a folder inside run.output_dir (no '..', not absolute, "
                             "not empty); set run.output_dir for another place")
        return self


class DistributedConfig(_Section):
    async_training: bool = Field(
        False, description="Generate the next batches while the trainer updates on this one (AReaL-style). "
        "Staleness is bounded by max_staleness; pair with algo.offpolicy_correction=decoupled (or tis).")
    max_staleness: int = Field(
        1, ge=0, description="Asynchronous training: the batch trained at version v was started at version v - "
        "max_staleness or later (AReaL's eta: at most (eta + v + 1) batches accepted or running). 0 is the "
        "synchronous loop.")
    backend: Literal["local", "ray"] = Field(
        "local", description="Where rollout workers run: local (a thread in this process; correct but shares the "
        "GIL with the trainer) or ray (Ray actors, each its own process, restarted if it dies).")
    rollout_workers: int = Field(1, gt=0, description="Rollout workers (more than 1 with backend=ray); each round's requests are dealt "
                                 "among them, a request's samples on one worker (a prompt's later top-up may run on "
                                 "another).")
    ray_address: str | None = Field(
        None, description="Ray cluster address for backend=ray (default: start Ray on this machine's cores).")
    worker_threads: int = Field(1, gt=0, description="torch threads (and Ray CPUs) per rollout worker.")
    max_worker_restarts: int = Field(
        3, ge=0, description="backend=ray: times Ray restarts a rollout worker that died (its interrupted call runs "
        "again, nothing is lost); one more death stops the run with an error (resume from the last checkpoint).")
    worker_timeout: float | None = Field(
        None, gt=0, description="backend=ray: seconds one round of generation may take on the rollout workers before "
        "the run stops with an error that says how to resume (None = wait as long as it takes; a worker that hangs "
        "then hangs the run).")
    worker_gpus: float = Field(0.0, ge=0, description="GPUs Ray reserves per rollout worker (backend=ray; needed, above "
                               "0, with a GPU engine; a fraction lets workers share a GPU with each other; the trainer "
                               "actor reserves a whole GPU of its own with model.device=cuda).")
    weight_sync_tokens: int = Field(
        256, gt=0, description="Asynchronous training: a worker checks for new weights after this many sampled "
        "tokens; sequences in flight keep their tokens and continue under the new weights (their KV is "
        "recomputed unless rollout.partial_keep_kv).")


class Config(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model.")
    data: DataConfig = Field(default_factory=DataConfig, description="Tasks and prompts.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Rewards.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Generation.")
    algo: AlgoConfig = Field(default_factory=AlgoConfig, description="Advantages and losses.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation.")
    planner: PlannerConfig = Field(default_factory=PlannerConfig, description="Rollout planning.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    run: RunConfig = Field(default_factory=RunConfig, description="Run folder, seed, logging.")
    distributed: DistributedConfig = Field(default_factory=DistributedConfig,
                                           description="Asynchronous training and rollout workers (Ray).")

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        if self.model.lora.enabled and not self.model.lora.target_modules:  # peft refused it after the folder was made
            raise ValueError("model.lora.target_modules is empty: LoRA needs at least one module to adapt (for "
                             "example [q_proj, v_proj]); or set model.lora.enabled=false")
        a = self.algo
        if a.epsilon_high is not None and a.epsilon_high < a.epsilon and a.policy_loss != "cispo":  # cispo: no lower bound
            raise ValueError(f"algo.epsilon_high ({a.epsilon_high}) must be >= algo.epsilon ({a.epsilon})")
        if a.icepop_low > a.icepop_high:
            raise ValueError(f"algo.icepop_low ({a.icepop_low}) must be <= algo.icepop_high ({a.icepop_high})")
        if self.reward.overlong_buffer >= self.rollout.max_completion_length:
            raise ValueError(f"reward.overlong_buffer ({self.reward.overlong_buffer}) must be below "
                             f"rollout.max_completion_length ({self.rollout.max_completion_length}): the punishment "
                             "starts that many tokens before the cap")
        from rollwise.planner.strategies import (  # no config import
            group_cap_error,
            part,
            screen_allocator,
            unused_options,
            whole_round_parts,
        )

        why = unused_options(self.planner)
        if why:
            raise ValueError(why)
        pl = self.planner
        if screen_allocator(pl) and pl.screen_size >= self.rollout.num_generations:
            n = self.rollout.num_generations
            fix = (f"raise rollout.num_generations above {pl.screen_size} (8 is usual)" if n == 1 else
                   f"raise rollout.num_generations above {pl.screen_size}, lower planner.screen_size below {n}, or "
                   "choose a strategy that does not probe (planner.strategy=uniform)")
            raise ValueError(f"planner.screen_size ({pl.screen_size}) must be below rollout.num_generations "
                             f"({n}): a probe that large is a whole group, so the screen allocator of strategy "
                             f"'{pl.strategy}' would never probe; {fix}")
        if self.rollout.num_generations == 1 and part(pl, "allocator") == "fixed":
            raise ValueError(f"rollout.num_generations=1 with strategy '{pl.strategy}' (allocator 'fixed'): every group "
                             f"is one sample, whose advantage against its group's mean is 0 (algo.advantage="
                             f"{self.algo.advantage}), so the policy loss trains nothing; give 2 or more (8 is usual)")
        if pl.budget_rollouts is not None and pl.budget_tokens is not None:
            raise ValueError(f"planner.budget_rollouts ({pl.budget_rollouts}) and planner.budget_tokens "
                             f"({pl.budget_tokens}) are both set; a step's budget is in one unit: keep one")
        lo, hi = pl.min_samples_per_prompt, pl.max_samples_per_prompt
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"planner.min_samples_per_prompt ({lo}) must be <= planner.max_samples_per_prompt ({hi})")
        n, alloc = self.rollout.num_generations, part(pl, "allocator")
        # the allocators' own default maxima (planner/allocators.py): a minimum above one was accepted, then every
        # prompt got the maximum
        default_hi = {"knapsack": (16 * n, "16 x"), "rank": (n + n // 2, "1.5 x")}.get(alloc or "")
        if lo is not None and hi is None and default_hi is not None and lo > default_hi[0]:
            raise ValueError(f"planner.min_samples_per_prompt ({lo}) must be <= the most samples a prompt gets, "
                             f"{default_hi[0]} (allocator '{alloc}' of strategy '{pl.strategy}': {default_hi[1]} "
                             f"rollout.num_generations, as planner.max_samples_per_prompt is unset); set "
                             f"planner.max_samples_per_prompt to {lo} or more, or lower the minimum")
        cap = group_cap_error(pl, n)  # make_planner's check, said before the model loads
        if cap:
            raise ValueError(cap)
        if pl.greso_explore_min > pl.greso_explore_max:
            raise ValueError(f"planner.greso_explore_min ({pl.greso_explore_min}) must be <= "
                             f"planner.greso_explore_max ({pl.greso_explore_max})")
        r = self.rollout
        for flag in ("partial_rollouts", "speculative_reuse"):
            if getattr(r, flag) and r.engine != "continuous":
                raise ValueError(f"rollout.{flag}=true needs rollout.engine=continuous (it resumes responses from a "
                                 f"prefix), got rollout.engine={r.engine}")
        if r.overlap_rounds:
            why = ("rollout.engine=hf (static batches)" if r.engine == "hf" else
                   "rollout.partial_rollouts=true (its rounds stop early)" if r.partial_rollouts else
                   "rollout workers (distributed.async_training or distributed.backend=ray)"
                   if self.distributed.async_training or self.distributed.backend == "ray" else "")
            if why:
                raise ValueError(f"rollout.overlap_rounds=true needs the continuous or vllm engine in the synchronous "
                                 f"loop without partial rollouts; this config has {why}. Leave overlap_rounds unset.")
            parts = whole_round_parts(self.planner)
            if parts:
                raise ValueError(f"rollout.overlap_rounds=true: planner.strategy={self.planner.strategy} uses "
                                 f"{' and '.join(parts)}, which decide extra rounds from a whole round at once "
                                 "(dapo's back-fill, dars's second round); leave rollout.overlap_rounds unset")
        if r.transpose_weights and r.engine == "vllm":
            raise ValueError("rollout.transpose_weights=true applies to the hf and continuous engines (their copy of "
                             "the model); vLLM keeps its own weight layout. Leave it unset with rollout.engine=vllm")
        if r.speculative_reuse and (r.top_p < 1.0 or r.top_k):
            raise ValueError("rollout.speculative_reuse=true needs plain temperature sampling (rollout.top_p=1, "
                             "rollout.top_k=0): the acceptance test compares full-distribution probabilities")
        d = self.distributed
        if d.backend == "local" and d.rollout_workers > 1:
            raise ValueError(f"distributed.rollout_workers={d.rollout_workers} needs distributed.backend=ray: the local "
                             "backend has one rollout worker in this process (more would only take turns). Set "
                             "distributed.backend=ray, or leave rollout_workers at 1")
        if d.async_training or d.backend == "ray":
            for flag in ("partial_rollouts", "speculative_reuse"):
                if getattr(r, flag):
                    raise ValueError(f"rollout.{flag}=true is not supported with rollout workers yet "
                                     "(distributed.async_training or distributed.backend=ray): turn one of them off")
            if r.engine == "hf":
                raise ValueError("rollout workers (distributed.async_training or distributed.backend=ray) need "
                                 "rollout.engine=continuous or vllm (they pause and resume sequences), got hf")
        if d.backend == "ray" and d.worker_gpus == 0 and (self.model.device == "cuda" or r.engine == "vllm"):
            raise ValueError("distributed.backend=ray with a GPU engine (model.device=cuda or rollout.engine=vllm) "
                             "needs distributed.worker_gpus > 0: Ray hides the GPUs from an actor that reserves none, "
                             "so the rollout workers could not start (distributed.worker_gpus=0.5 lets two share one)")
        ev = self.eval
        if ev.early_stopping_patience and not ev.every_n_steps:
            raise ValueError(f"eval.early_stopping_patience={ev.early_stopping_patience} needs evaluations during "
                             "training: set eval.every_n_steps (for example eval.every_n_steps=5)")
        return self


# ---------------------------------------------------------------- options a config sets but does not use


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


# ---------------------------------------------------------------- loading and overrides


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"config key '{key}': '{p}' is not a section")
        node = nxt
    node[parts[-1]] = value


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Turn ['algo.beta=0.04', 'data.tasks=[...]'] into a nested dict (values parsed as YAML)."""
    tree: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not KEY=VALUE (for example algo.beta=0.04)")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"override '{item}' has an empty key")
        parts = key.split(".")
        if "" in parts:
            raise ConfigError(f"override '{item}': the key '{key}' has an empty part (a dot too many); write "
                              "section.key=VALUE, for example algo.beta=0.04")
        listed = next((i for i, part in enumerate(parts) if part.isdigit() or "[" in part), None)
        if listed is not None:  # data.tasks.0.weight or data.tasks[0].weight
            whole = ".".join([*parts[:listed], parts[listed].split("[")[0]] if "[" in parts[listed] else parts[:listed])
            example = (" (for example data.tasks='[{name: basic_arithmetic, weight: 2}, {name: leg_counting}]')"
                       if whole == "data.tasks" else "")
            raise ConfigError(f"override '{item}': a list's items cannot be set one by one; give {whole} whole, as a "
                              f"YAML list{example}")
        text = _text_field(key)
        if text is not None and not _one_quoted_string(raw):
            # a text option keeps the text as typed: YAML would cut `#...` as a comment, read `a: b` as a
            # mapping and 2024-11-30 as a date; null (or ~) still means None where None is allowed
            _set_dotted(tree, key, None if text == "optional" and raw in ("null", "~") else raw)
            continue
        try:
            value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw != "" else ""  # noqa: S506  (a SafeLoader)
        except yaml.YAMLError as e:
            raise ConfigError(f"override '{item}': value is not valid YAML ({e})") from None
        _set_dotted(tree, key, value)
    return tree


def _one_quoted_string(raw: str) -> bool:
    """Whether `raw` is one quoted YAML string ('a: b', "x"), not text that only starts and ends with a quote
    ("Answer" then "stop")."""
    if not (len(raw) > 1 and raw[0] == raw[-1] and raw[0] in "'\""):
        return False
    try:
        return isinstance(yaml.safe_load(raw), str)
    except yaml.YAMLError:
        return False


def _text_field(key: str) -> str | None:
    """"text" when the dotted `key` is a str option of Config, "optional" when str | None, else None."""
    *sections, name = key.split(".")
    field = getattr(_model_at(tuple(sections)), "model_fields", {}).get(name)
    if field is None:
        return None
    ann = field.annotation
    if ann is str:
        return "text"
    args = {get_args(a)[0] if get_origin(a) is Annotated else a for a in get_args(ann)}  # PathStr is a str
    return "optional" if get_origin(ann) in (Union, UnionType) and args == {str, type(None)} else None


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _model_at(path: tuple[Any, ...]) -> Any:
    """The config section at `path` (names, list indices skipped), or None where there is none."""
    model: Any = Config
    for part in path:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", None)
        if args:
            ann = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        model = ann
    return model


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    return list(getattr(_model_at(loc[:-1]), "model_fields", {}).keys())


# TRL's GRPOConfig names (and HF TrainingArguments') that rollwise spells otherwise: an unknown key that is one of
# them is pointed to its rollwise key, wherever it was given
TRL_NAMES = {
    **{k: f"train.{k}" for k in ("learning_rate", "max_steps", "warmup_steps", "max_grad_norm", "weight_decay",
                                 "gradient_checkpointing", "adam_beta1", "adam_beta2", "disable_dropout")},
    **{k: f"algo.{k}" for k in ("beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards", "num_iterations",
                                "mask_truncated_completions")},
    **{k: f"rollout.{k}" for k in ("num_generations", "max_completion_length", "temperature", "top_p", "top_k")},
    "lr_scheduler_type": "train.lr_scheduler", "per_device_train_batch_size": "train.micro_batch_size (samples a "
    "forward/backward; a step trains rollout.prompts_per_step x num_generations)",
    "gradient_accumulation_steps": "train.micro_batch_size (a step is one batch of rollout.prompts_per_step x "
    "num_generations, split into micro-batches)", "max_prompt_length": "data.max_prompt_length",
    "save_steps": "run.save_every", "save_total_limit": "run.keep_checkpoints", "eval_steps": "eval.every_n_steps",
    "per_device_eval_batch_size": "eval.batch_size", "seed": "run.seed", "output_dir": "run.output_dir",
    "run_name": "run.name", "use_vllm": "rollout.engine=vllm", "importance_sampling_level": "algo.policy_loss=gspo "
    "(sequence-level ratios)", "reward_weights": "reward.functions' weight", "model_name_or_path": "model.name_or_path",
}


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc) or "(config)"
        if e["type"] == "extra_forbidden":
            known = _fields_at(loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f" Did you mean '{'.'.join(str(p) for p in loc[:-1] + (close[0],))}'?" if close else ""
            if str(loc[-1]) in TRL_NAMES:  # an exact TRL name: its key, not a look-alike here (save_steps != max_steps)
                hint = f" TRL's {loc[-1]} is {TRL_NAMES[str(loc[-1])]} here."
            lines.append(f"unknown config key '{key}'.{hint} Known keys here: {', '.join(known)}")
        elif e["type"] == "literal_error":
            allowed = e.get("ctx", {}).get("expected", "")
            lines.append(f"config key '{key}': got {e.get('input')!r}; allowed: {allowed}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            got = e.get("input")
            shown = "" if isinstance(got, (dict, list)) and len(repr(got)) > 80 else f" (got {got!r})"
            lines.append(msg if key == "(config)" else f"config key '{key}': {msg}{shown}")
    return "invalid config:\n  " + "\n  ".join(lines)


def build_config(data: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e)) from None


def read_run_config(run_dir: str | Path) -> dict[str, Any]:
    """A run folder's config.yaml as `rollwise train` wrote it; a ConfigError when it is empty or damaged."""
    path = Path(run_dir) / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text())
        why = "it is empty" if saved is None else None if isinstance(saved, dict) else "it holds no settings"
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        why = f"not valid YAML: {str(e).splitlines()[0]}"
    if why:
        raise ConfigError(f"{path} cannot be read ({why}), so the run's settings are unknown. Put back a copy of "
                          "that file, or start a new run")
    return saved


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.line, self.first = key, line, first


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a key given twice in one mapping (a second `train:` section)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: keys given beside it override the base's
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                hash(key)
            except TypeError:  # a list as a key: SafeLoader's own error ("found unhashable key") names it
                continue
            if key in seen:
                raise _DuplicateKey(key, line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML config file's sections as a dict (not yet validated), or a ConfigError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file '{p}' not found (looked for it from {Path.cwd()}); check the path")
    if p.suffix.lower() in (".jsonl", ".csv", ".parquet"):  # `rollwise train data.jsonl`: a data file, not a config
        raise ConfigError(f"'{p}' is a data file, not a config file (.yaml): train on it as a file task, "
                          f"data.tasks='[{{name: {p.stem}, path: {p}, prompt_column: ..., answer_column: ...}}]' "
                          "(or the same under data: tasks: in a CONFIG.yaml); `rollwise options` lists the keys")
    try:
        loaded = yaml.load(p.read_text(), Loader=_UniqueKeyLoader) or {}  # noqa: S506  (a SafeLoader)
    except _DuplicateKey as e:
        raise ConfigError(f"config file '{p}': '{e.key}' is given twice in one section (lines {e.first} and "
                          f"{e.line}); YAML keeps only the last and would drop the other's settings without a "
                          "word. Merge them into one") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file '{p}' is not valid YAML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file '{p}' is not UTF-8 text (a Windows shell's `>` writes UTF-16); save it as "
                          "UTF-8") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file '{p}' must hold a mapping of sections, got {type(loaded).__name__}")
    return _empty_sections(loaded)


def _empty_sections(tree: dict[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """`tree` with each section YAML read as null (`model:` with every key under it commented out) made empty."""
    out = dict(tree)
    fields = getattr(_model_at(path), "model_fields", {})
    for k, v in tree.items():
        sub = fields[k].annotation if k in fields else None  # a section, not a list of them (data.tasks)
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            continue
        if v is None:
            out[k] = {}
        elif isinstance(v, dict):
            out[k] = _empty_sections(v, (*path, k))
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults, then the YAML file, then dotted overrides; validated as a whole."""
    data = read_config_file(path) if path is not None else {}
    if overrides:
        data = _merge(data, parse_overrides(overrides))
    return build_config(data)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{dotted key: value} of a nested mapping's leaves (a list is one leaf)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """({dotted key: [old value, new value]} for every setting of `old` that differs in `new`,
    {dotted key: value} for every setting `new` has and `old` lacks, such as one a newer rollwise added)."""
    a, b = leaves(old), leaves(new)
    return {k: [a[k], b.get(k)] for k in a if a[k] != b.get(k)}, {k: v for k, v in b.items() if k not in a}


def describe_fields(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, description) for every leaf option: the options table of `rollwise options`; a list of
    sections (data.tasks, reward.functions) is followed by the keys of its items (`data.tasks[].path`)."""
    rows: list[tuple[str, str, str]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        key = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(describe_fields(ann, key + "."))
            continue
        if field.is_required():  # a list item's own key, such as data.tasks[].name
            rows.append((key, "required", field.description or ""))
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list) and default and isinstance(default[0], BaseModel):
            default = [d.model_dump(exclude_defaults=True) for d in default]
        rows.append((key, repr(default), field.description or ""))
        item = get_args(ann)[0] if get_origin(ann) is list and get_args(ann) else None
        if isinstance(item, type) and issubclass(item, BaseModel):  # the keys of each item: data.tasks[].path
            rows.extend(describe_fields(item, f"{key}[]."))
    return rows
