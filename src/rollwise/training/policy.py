"""The policy update: advantages, then `num_iterations` clipped updates in micro-batches.

Zero-gradient samples cost nothing: a sample whose advantage is exactly 0 adds nothing to
the policy loss or its gradient, so when no other term needs it (beta = 0, no entropy bonus)
it is never forwarded. The normalisers (token and sequence counts) still count it, so the
loss and the gradient are exactly those of the whole batch (except under the m2po correction,
whose token mask is chosen over each micro-batch's tokens, zero-advantage rows included).

Off-policy correction (`algo.offpolicy_correction`, see `rollwise.algos.offpolicy`). Three
policies meet: the behaviour policy (the engine's per-token log-probs `Sample.behaviour_logprobs`,
possibly from older weight versions and always from another kernel and dtype), the proximal
policy (these weights at the start of the update: the log-probs recomputed at iteration 0)
and the current policy. Per micro-batch the correction gives the PPO denominator, a per-token
weight on the policy-gradient term and the final loss mask; the default `recompute` uses the
recomputed log-probs as the denominator with weight 1 and changes nothing else.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rollwise import algos
from rollwise.config import Config
from rollwise.errors import TrainingDivergedError
from rollwise.models import compute_dtype, disable_dropout
from rollwise.training.logprobs import pack, pack_shared, response_logprobs, shares_prompts
from rollwise.types import Sample


def lr_lambda(warmup: int, total: int, kind: str, spent: Callable[[], float] | None = None):
    """The learning-rate factor of optimizer update `step` (0-based) out of `total`.

    Linear warm-up over `warmup` updates, then `kind` decays to 0 at the end of the run. The end
    is whichever comes first: `total` updates or, when `spent` is given, the rollout-token budget
    (`spent()` is the fraction of train.max_rollout_tokens generated so far), so a run that the
    token budget stops still finishes its decay.
    """
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant" or total <= warmup:
            return 1.0
        frac = (step - warmup) / max(1, total - warmup)
        if spent is not None:
            frac = max(frac, spent())
        frac = min(1.0, frac)
        return 1.0 - frac if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))

    return f


@dataclass
class _Row:
    sample: Sample
    mask_len: int  # tokens counted in the loss normaliser (0 if masked out as truncated)
    resumed: list[bool]  # per response token: produced by an older version than the sample's newest


def _resumed_tokens(s: Sample) -> list[bool]:
    """Flag the tokens of a resumed prefix (a policy version older than the sample's newest).

    Raises:
        ValueError: `behaviour_logprobs` or `versions` do not have one entry per response token.
    """
    n = s.num_response_tokens
    if len(s.behaviour_logprobs) != n or len(s.versions) != n:
        raise ValueError(
            f"sample of prompt {s.prompt_uid!r} has {n} response tokens but {len(s.behaviour_logprobs)} "
            f"behaviour log-probs and {len(s.versions)} versions; the engine must return one of each per token"
        )
    newest = max(s.versions, default=0)
    return [v < newest for v in s.versions]


def _behaviour_tensors(rows: list[_Row], R: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(behaviour log-probs [b, R], resumed mask [b, R]), right-padded with 0 like `pack` pads responses."""
    behaviour = torch.zeros((len(rows), R), dtype=torch.float32)
    resumed = torch.zeros((len(rows), R), dtype=torch.float32)
    for b, r in enumerate(rows):
        n = r.sample.num_response_tokens
        if n:
            behaviour[b, :n] = torch.tensor(r.sample.behaviour_logprobs, dtype=torch.float32)
            resumed[b, :n] = torch.tensor(r.resumed, dtype=torch.float32)
    return behaviour, resumed


def _correction_options(a) -> dict:
    """The keyword options of `a.offpolicy_correction`, from the algo config."""
    return {
        "tis": {"cap": a.tis_cap},
        "decoupled": {"cap": a.decoupled_cap},
        "m2po": {"tau": a.m2po_tau},
        "icepop": {"low": a.icepop_low, "high": a.icepop_high, "weighted": a.icepop_weighted},
    }.get(a.offpolicy_correction, {})


def _length(r: _Row) -> int:
    return len(r.sample.prompt_ids) + r.sample.num_response_tokens


def _order(rows: list[_Row]) -> list[_Row]:
    """Rows of one prompt next to each other (so a micro-batch can run the prompt once), groups
    ordered by their longest sequence to keep padding low; with every prompt distinct this is
    the per-sample layout's order (by length)."""
    groups: dict[tuple[int, ...], list[_Row]] = {}
    for r in rows:
        groups.setdefault(tuple(r.sample.prompt_ids), []).append(r)
    return [r for g in sorted(groups.values(), key=lambda g: max(_length(r) for r in g)) for r in g]


def _enable_checkpointing(model: torch.nn.Module) -> None:
    """Gradient checkpointing, non-reentrant whatever transformers' default: transformers 4.x checkpoints with
    use_reentrant=True, which under LoRA (frozen embeddings: the layers' input needs no gradient) cuts the graph
    at each layer, so the adapters inside got no gradient. transformers 5 renamed the switch."""
    kwargs = {"use_reentrant": False}
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        enable = getattr(model, f"{name}_enable", None)
        if enable is not None:
            enable(**{f"{name}_kwargs": kwargs})
            return


class PolicyTrainer:
    def __init__(self, cfg: Config, model: torch.nn.Module, pad_id: int):
        self.cfg = cfg
        self.model = model
        self.pad_id = pad_id
        self.dtype = compute_dtype(cfg.model.dtype, cfg.model.device)
        self.device = next(model.parameters()).device
        params = [p for p in model.parameters() if p.requires_grad]
        t = cfg.train
        self.optimizer = torch.optim.AdamW(
            params, lr=t.learning_rate, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay
        )
        total_updates = t.max_steps * cfg.algo.num_iterations
        self._budget_spent = 0.0  # fraction of train.max_rollout_tokens spent, set by update()
        # the fraction spent when the decay began (end of warm-up): the decay runs over the rest of the
        # budget, so the tokens of the warm-up do not count as decay already done (a jump in the rate)
        self._decay_from: float | None = 0.0 if t.warmup_steps == 0 else None
        spent = self._decay_spent if t.max_rollout_tokens is not None else None
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(t.warmup_steps, total_updates, t.lr_scheduler, spent)
        )
        if t.disable_dropout:
            disable_dropout(model)
        self.ref_model = None
        if cfg.algo.beta > 0 and not hasattr(model, "peft_config"):
            # the policy's own weights (float32) run under the same autocast: at step 0 the two are
            # identical; a bf16 copy differed (KL 7.5e-4 on SmolLM2-135M before any update)
            self.ref_model = copy.deepcopy(model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        if t.gradient_checkpointing:
            _enable_checkpointing(model)
        self.share_prompts = t.share_prompt_forward and shares_prompts(model)
        # float16 autocast needs loss scaling: the gradients of a loss normalised over a batch's tokens are small
        # enough to flush to 0 in float16 (a no-op for float32 and bfloat16, whose range is float32's)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)

    def state_dict(self) -> dict[str, Any]:
        """Optimizer and scheduler state (the weights are checkpointed separately)."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "decay_from": self._decay_from, "num_iterations": self.cfg.algo.num_iterations,
                "max_rollout_tokens": self.cfg.train.max_rollout_tokens, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler.is_enabled() and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        # the saved base rate and AdamW settings would override the config's, which a resume may change
        t = self.cfg.train
        self.scheduler.base_lrs = [t.learning_rate] * len(self.optimizer.param_groups)
        for g in self.optimizer.param_groups:
            g["betas"], g["weight_decay"] = (t.adam_beta1, t.adam_beta2), t.weight_decay
        # the schedule counts optimizer updates: a resume that changes algo.num_iterations keeps its place
        # in steps (the rate jumped, and the decay ended elsewhere than at train.max_steps)
        iters = state.get("num_iterations", self.cfg.algo.num_iterations)
        if iters != self.cfg.algo.num_iterations:
            self.scheduler.last_epoch = round(self.scheduler.last_epoch * self.cfg.algo.num_iterations / iters)
        past_warmup = self.scheduler.last_epoch > self.cfg.train.warmup_steps
        # older checkpoints: the decay counted from the run's first token
        self._decay_from = state.get("decay_from", 0.0 if past_warmup else self._decay_from)
        # a share of the saved token budget: the same tokens in a budget a resume changed
        budget, now = state.get("max_rollout_tokens"), self.cfg.train.max_rollout_tokens
        if self._decay_from is not None and budget and now and budget != now:
            self._decay_from = self._decay_from * budget / now

    def _decay_spent(self) -> float:
        """The share of the token budget left at the end of warm-up that has been spent since."""
        start = self._decay_from or 0.0
        return max(0.0, (self._budget_spent - start) / max(1.0 - start, 1e-12))

    # ------------------------------------------------------------------ advantages
    def compute_advantages(self, samples: list[Sample]) -> dict[str, float]:
        """Set `sample.advantage` for every sample (replayed ones included: they anchor the group)."""
        if not samples:
            return {}
        a = self.cfg.algo
        uids = {u: i for i, u in enumerate(dict.fromkeys(s.prompt_uid for s in samples))}
        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)  # [N]
        groups = torch.tensor([uids[s.prompt_uid] for s in samples])  # [N]
        fn = algos.get_advantage_fn(a.advantage)
        adv = fn(rewards, groups, scale=a.scale_rewards) if a.advantage == "grpo" else fn(rewards, groups)
        for s, v in zip(samples, adv.tolist()):
            s.advantage = float(v)
        zero_std = sum(
            1 for g in range(len(uids)) if torch.unique(rewards[groups == g]).numel() == 1
        )
        trained = torch.tensor([not s.stop_gradient for s in samples])  # replayed anchors shape the statistics only
        abs_mean = float(adv.abs()[trained].mean()) if bool(trained.any()) else 0.0
        return {"rollout/frac_zero_std_groups": zero_std / len(uids), "train/advantage_abs_mean": abs_mean}

    # ------------------------------------------------------------------ update
    def _autocast(self):
        enabled = self.dtype != torch.float32
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=enabled)

    def _apply_lr(self, spent: float) -> float:
        """Set this update's learning rate from the schedule with the token budget `spent` so far."""
        self._budget_spent = spent
        if self._decay_from is None and self.scheduler.last_epoch >= self.cfg.train.warmup_steps:
            self._decay_from = spent  # the first update after warm-up
        f = self.scheduler.lr_lambdas[0]
        for g, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs):
            g["lr"] = base * f(self.scheduler.last_epoch)
        return float(self.optimizer.param_groups[0]["lr"])

    def _diverged(self, what: str) -> TrainingDivergedError:
        return TrainingDivergedError(
            f"{what}. The policy has diverged: the learning rate is too high (train.learning_rate="
            f"{self.cfg.train.learning_rate:g}) or the rewards' scale too large. Continue from the last checkpoint "
            "with a lower rate (`rollwise train --resume RUN_DIR train.learning_rate=...`), or start again")

    def update(self, samples: list[Sample], budget: tuple[float, float] | None = None) -> dict[str, float]:
        """num_iterations optimizer steps on `samples` (advantages already set).

        `budget`: the fractions of train.max_rollout_tokens spent before and after this batch was
        generated; the learning-rate decay then also follows the token budget (see `lr_lambda`),
        the k-th of num_iterations updates at before + (after - before) * k / num_iterations.
        """
        cfg, a = self.cfg, self.cfg.algo
        rows = []
        for s in samples:
            if s.stop_gradient:  # replayed responses (versions -1) never reach the loss
                continue
            resumed = _resumed_tokens(s)
            masked = a.mask_truncated_completions and s.finish_reason == "length"
            n = 0 if masked else s.num_response_tokens
            if n and a.offpolicy_correction == "mask_resumed":
                # known before any forward, so the normaliser counts only the trained tokens
                # (at least the newest version's tokens remain: the row never becomes empty)
                n -= sum(resumed)
            rows.append(_Row(s, n, resumed))
        # Normalisers. A correction that masks tokens by their log-probs (icepop, m2po) only
        # knows its mask after the forward, and rows skipped for a zero advantage are never
        # forwarded: those tokens stay in num_tokens (the loss is the kept tokens' sum over the
        # unmasked count, about offpolicy/kept_frac times their mean). That keeps one forward per
        # micro-batch, and icepop's gradient is the same whether zero-advantage rows are skipped
        # or not (m2po's mask depends on which rows share its micro-batch in any case). Per-row
        # means ("grpo") use the kept tokens of each row; "dr_grpo" divides by a constant anyway.
        num_sequences = len(rows)
        masked = sum(r.mask_len == 0 for r in rows)
        num_tokens = sum(r.mask_len for r in rows)
        needs_all = a.beta > 0 or a.entropy_coef > 0 or not cfg.train.skip_zero_advantage
        active = [r for r in rows if r.mask_len > 0 and (needs_all or r.sample.advantage != 0.0)]
        active = _order(active) if self.share_prompts else sorted(active, key=_length)
        mb = cfg.train.micro_batch_size
        micro = [active[i : i + mb] for i in range(0, len(active), mb)]
        loss_fn = algos.get_policy_loss(a.policy_loss)
        correct = algos.get_offpolicy_correction(a.offpolicy_correction)
        correct_opts = _correction_options(a)
        eps_high = a.epsilon_high if a.epsilon_high is not None else a.epsilon
        old: dict[int, torch.Tensor] = {}
        # the KL reference's log-probs per micro-batch, taken at the first pass: the reference (an eval-mode copy,
        # or the LoRA policy with its adapters off) is the same at every pass, so later passes reuse them
        refs: dict[int, torch.Tensor] = {}
        sums: dict[str, float] = {}
        off_sums: dict[str, float] = {}
        tok_w = in_w = 0.0
        self.model.train()
        lr = 0.0  # the rate of the last update, for the metrics
        overflowed = 0  # float16 updates skipped because the scaled gradient overflowed
        before, after = budget if budget is not None else (0.0, 0.0)
        for it in range(a.num_iterations):
            lr = self._apply_lr(before + (after - before) * it / a.num_iterations)
            self.optimizer.zero_grad(set_to_none=True)
            total_loss = 0.0
            for mi, rws in enumerate(micro):
                prompts = [r.sample.prompt_ids for r in rws]
                shared = self.share_prompts and len({tuple(p) for p in prompts}) < len(prompts)
                batch = (pack_shared if shared else pack)(prompts, [r.sample.response_ids for r in rws],
                                                          self.pad_id).to(self.device)
                mask = batch.response_mask.clone()  # [b, R]
                for b, r in enumerate(rws):
                    if r.mask_len == 0:
                        mask[b] = 0
                with self._autocast():
                    logp, ent = response_logprobs(
                        self.model, batch, cfg.rollout.temperature, cfg.train.logprob_chunk, a.entropy_coef > 0
                    )  # [b, R]
                if it == 0:
                    old[mi] = logp.detach()  # proximal log-probs: the weights at the start of the update
                behaviour, resumed = (t.to(self.device) for t in _behaviour_tensors(rws, logp.shape[1]))  # [b, R]
                c = correct(logp, behaviour, mask, resumed, old[mi], **correct_opts)
                keep = c.mask  # [b, R]; the input mask minus the tokens the correction drops
                adv = torch.tensor([r.sample.advantage for r in rws], dtype=torch.float32, device=self.device)  # [b]
                kwargs = {"epsilon": a.epsilon, "epsilon_high": eps_high}
                if a.policy_loss == "ppo_clip":
                    kwargs["dual_clip"] = a.dual_clip
                per_tok, m = loss_fn(logp, c.old_logp, adv, keep, **kwargs)  # [b, R]
                # the importance weight corrects the policy-gradient term only (as slime's TIS
                # and AReaL's decoupled loss do); KL and entropy terms are masked but not weighted
                per_tok = per_tok * c.weight
                if a.beta > 0:
                    if it == 0:
                        refs[mi] = self._ref_logprobs(batch)
                    kl = algos.kl_penalty(logp, refs[mi], a.kl_estimator)  # [b, R]
                    per_tok = per_tok + a.beta * kl
                    m = {**m, "kl": algos.masked_mean(kl.detach(), keep)}
                if a.entropy_coef > 0:
                    per_tok = per_tok - a.entropy_coef * ent
                    m = {**m, "entropy": algos.masked_mean(ent.detach(), keep)}
                loss = algos.aggregate_loss(
                    per_tok, keep, a.loss_type, max_completion_length=cfg.rollout.max_completion_length,
                    num_tokens=num_tokens, num_sequences=num_sequences,
                )
                self.scaler.scale(loss).backward()
                total_loss += float(loss.detach())
                if it == a.num_iterations - 1:
                    w = float(keep.sum())  # loss metrics are means over trained tokens
                    tok_w += w
                    for k, v in m.items():
                        sums[k] = sums.get(k, 0.0) + float(v) * w
                    w_in = float(mask.sum())  # correction metrics are per input token
                    in_w += w_in
                    for k, v in c.metrics.items():
                        off_sums[k] = off_sums.get(k, 0.0) + float(v) * w_in
            if not micro:  # nothing to forward: the true gradient is exactly zero, the step still happens
                for p in self.model.parameters():
                    if p.requires_grad:
                        p.grad = torch.zeros_like(p)
            trained = [p for p in self.model.parameters() if p.requires_grad]
            self.scaler.unscale_(self.optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(trained, self.cfg.train.max_grad_norm)
            if not math.isfinite(float(grad_norm)):
                self.optimizer.zero_grad(set_to_none=True)
                if self.scaler.is_enabled() and self.scaler.get_scale() > 1.0:
                    self.scaler.update()  # float16: the scaled gradient overflowed; skip it at half the scale
                    overflowed += 1
                    continue
                raise self._diverged(f"the gradient of this update is not finite (norm {float(grad_norm)}); nothing "
                                     "was applied")
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if not bool(torch.stack([torch.isfinite(p).all() for p in trained]).all()):  # one device sync
                raise self._diverged("this update left weights that are not finite; they are not saved")
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        out = {f"loss/{k}": v / tok_w for k, v in sums.items()} if tok_w else {}
        if in_w:
            out.update({f"offpolicy/{k}": v / in_w for k, v in off_sums.items()})
        out.update({
            "loss/policy": total_loss,
            "train/grad_norm": float(grad_norm) if micro else 0.0,
            "train/lr": lr,  # the rate of this step's last optimizer update
            "train/sequences": float(num_sequences),
            "train/forwarded_sequences": float(len(active)),
            # not forwarded: zero advantage, or no token left in the loss (algo.mask_truncated_completions)
            "train/skipped_zero_adv": float(num_sequences - len(active) - masked),
            "train/masked_sequences": float(masked),
        })
        if self.scaler.is_enabled():
            out["train/fp16_skipped_updates"] = float(overflowed)
        return out

    @torch.no_grad()
    def _ref_logprobs(self, batch) -> torch.Tensor:
        with self._autocast():
            if self.ref_model is not None:
                lp, _ = response_logprobs(self.ref_model, batch, self.cfg.rollout.temperature, self.cfg.train.logprob_chunk)
            else:  # LoRA: the base model with adapters switched off is the reference, in eval mode like the
                # full-weights reference (no dropout where train.disable_dropout=false left some)
                training = self.model.training
                self.model.eval()
                try:
                    with self.model.disable_adapter():
                        lp, _ = response_logprobs(self.model, batch, self.cfg.rollout.temperature,
                                                  self.cfg.train.logprob_chunk)
                finally:
                    self.model.train(training)
        return lp
