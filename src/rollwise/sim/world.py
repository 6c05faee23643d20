"""A pure-numpy model of RLVR training dynamics: it stands in for the engine and the rewarder.

Items (prompts) follow an item-response model. Prompt i is solved with probability

    q_i = sigmoid(a_i * (theta + delta_i - b_i))      (0 for the unsolvable share)

times the chance that a correct response fits under the length cap. theta is the global skill
(shared by training and held-out prompts), delta_i a per-prompt offset that training on the
prompt raises (memorisation) and that drifts, b_i the difficulty, a_i the discrimination.

With `feature_r2` > 0 each prompt has a feature that the planner sees before any rollout (a
stand-in for a prompt's token length, which `planner.length_prior` reads): a standard normal
with correlation sqrt(feature_r2) to its difficulty b_i over the pool.

With `tasks` = K > 0 the prompts belong to K tasks (uids "k<t>:t<i>", so the planner's
stratification and per-task priors see them): a share of the difficulty spread is the task's
(b_i = c_t + e_i, sd(c) = task_sd, sd(c + e) = difficulty_sd), and each task has a skill of
its own, theta + phi_t. Of a step's skill gain G, the share `transfer` raises theta (every
task) and the rest raises the tasks in proportion to their effective samples:
phi_t += (1 - transfer) * G * K * E_t / E, so balanced training moves every task by G, as
without tasks, while training on one task leaves the others behind. K = 0 is the world above.

A trained group with c correct of n gives the signal s = 4 c (n-c) / n^2 in [0, 1]
(1 at c = n/2, 0 for a group with equal rewards); E = sum over trained groups of n * s is
the step's "effective samples". A replayed correct response (stop-gradient) counts as one
extra correct in the group statistics and its signal is weighted by `replay_weight`. The
learning laws turn E into a skill gain:

- signal:     d theta = lr * E / N_ref            (SGD on a sum-normalised loss)
- mean:       d theta = lr * E / N_trained        (loss averaged over the trained batch)
- saturating: d theta = lr * k * (1 - exp(-E / (k * N_ref))), k = 1/4
              (diminishing returns per effective sample, as with Adam and a critical batch)

N_ref is the uniform batch (prompts_per_step * num_generations). Held-out accuracy is the
exact mean solve rate of the held-out prompts: it moves only through theta (and kappa).

With `revisit_decay` = r < 1 a prompt's group counts r^k of its effective samples toward the
skill gain when the prompt has been trained on with a signal k times before (its own offset
delta_i still gains in full): retraining one prompt teaches the held-out prompts less than a
new one does. r = 1 counts a revisit like a new prompt. The default, 0.85, is what real training
measured: fitted on the planner bench (pool 200), then tested, preregistered, at a pool of 64
(bench/preregistered/revisit_decay_pool64.txt), where r = 1 missed by 2.7 standard errors, and
again at 24 steps, where it compounds (revisit_decay_long24.txt: r = 1 missed by 3.0).

With `polarise` = p > 0 a share p of each step's gain G widens the spread of difficulty instead
of shifting every prompt: the logit is a_i * (theta + ... - kappa * b_i), kappa starts at 1 and
grows by p * G / difficulty_sd (a prompt one sd easier than the mean gains p * G, one sd harder
loses it), theta by (1 - p) * G. That is what training did to the default job's held-out prompts
(bench/learning_shape.py: spread 0.75 -> 3.52 logits over 40 steps, mean +0.15).

With `polarise_law` = "add" the spread grows by a part of its own instead: each prompt has a
learnability v_i, standard normal and independent of its difficulty, the logit gains g * v_i, and
g grows by p * G (theta by (1 - p) * G). Which prompts become easy cannot then be told from their
start, and the spread of logits is sqrt((sd of b)^2 + g^2): the form `simulate --fit` fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rollwise.planner.base import GroupResult, Request

LAWS = ("signal", "mean", "saturating")
POLARISE_LAWS = ("scale", "add")


@dataclass
class SimParams:
    n_train: int = 1024
    n_eval: int = 512
    unsolvable: float = 0.1  # share of prompts no skill solves
    difficulty_sd: float = 2.5  # b ~ Normal(0, sd)
    discrimination: float = 1.5  # a ~ LogNormal(log(discrimination), 0.25)
    skill0: float = -2.5  # initial theta (held-out accuracy starts near 0.17)
    law: str = "signal"
    lr: float = 0.04  # skill gain scale
    local_lr: float = 0.1  # per-prompt offset gain per effective sample / num_generations
    drift: float = 0.05  # per-step random-walk sd of training prompts' offsets
    replay_weight: float = 0.5  # signal weight of a group repaired by a replayed response
    length_median: float = 200.0  # median tokens of a correct response at difficulty 0
    length_sigma: float = 0.6  # log-sd of response lengths
    length_difficulty: float = 0.15  # log-median slope against difficulty
    wrong_length_factor: float = 1.5  # wrong responses are this much longer (median)
    max_len: int = 1024  # length cap; a truncated response scores 0
    tasks: int = 0  # 0 = one pool; K > 0: K tasks with their own difficulty and skill (module docstring)
    task_sd: float = 1.5  # sd of a task's difficulty offset (part of difficulty_sd)
    transfer: float = 0.5  # share of a step's skill gain that reaches every task
    feature_r2: float = 0.0  # share of the difficulty variance that a feature seen before any rollout explains
    polarise: float = 0.0  # share of the skill gain that widens the spread of difficulty (module docstring)
    polarise_law: str = "scale"  # scale: kappa * b_i; add: + g * v_i with a learnability v_i (module docstring)
    eval_threshold: float = 0.0  # 0: held-out accuracy is the mean solve rate; t > 0: the share of prompts above t
    revisit_decay: float = 0.85  # a prompt's k-th retraining adds revisit_decay^k of its signal to the skill (docstring)


def _phi(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


class World:
    """One simulated run: prompt parameters, the policy's skill, sampling and learning."""

    def __init__(self, params: SimParams, seed: int, prompts_per_step: int, num_generations: int):
        if params.law not in LAWS:
            raise ValueError(f"unknown learning law '{params.law}'; allowed: {', '.join(LAWS)}")
        if params.tasks < 0 or (params.tasks and not 0 <= params.task_sd < params.difficulty_sd):
            raise ValueError(f"tasks must be >= 0 and task_sd in [0, difficulty_sd) (got tasks={params.tasks}, "
                             f"task_sd={params.task_sd}, difficulty_sd={params.difficulty_sd})")
        if not 0.0 <= params.transfer <= 1.0:
            raise ValueError(f"transfer must be in [0, 1], got {params.transfer}")
        self.p = params
        rng = np.random.default_rng([seed, 17])
        m = params.n_train + params.n_eval
        self.b = rng.normal(0.0, params.difficulty_sd, m)
        k = params.tasks
        self.task = np.zeros(m, dtype=np.int64)
        self.phi = np.zeros(max(k, 1))  # each task's own skill on top of theta
        if k:  # a separate stream, so the world without tasks stays the same for a seed
            trng = np.random.default_rng([seed, 41])
            self.task = trng.integers(0, k, m)
            shared = trng.normal(0.0, params.task_sd, k)
            self.b = self.b * math.sqrt(1.0 - (params.task_sd / params.difficulty_sd) ** 2) + shared[self.task]
        if not 0.0 <= params.feature_r2 <= 1.0:
            raise ValueError(f"feature_r2 must be in [0, 1], got {params.feature_r2}")
        self.feature = np.zeros(m)  # with feature_r2 > 0: a prompt's feature, corr(feature, b) = sqrt(feature_r2)
        if params.feature_r2 > 0:  # a separate stream, so the world without a feature stays the same for a seed
            frng = np.random.default_rng([seed, 53])
            r = math.sqrt(params.feature_r2)
            self.feature = r * self.b / params.difficulty_sd + math.sqrt(1.0 - r * r) * frng.standard_normal(m)
        self.a = np.exp(rng.normal(math.log(params.discrimination), 0.25, m))
        self.solvable = rng.random(m) >= params.unsolvable
        self.delta = np.zeros(m)
        self.trained = np.zeros(m, dtype=np.int64)  # times each prompt was trained on with a signal
        if not 0.0 <= params.revisit_decay <= 1.0:
            raise ValueError(f"revisit_decay must be in [0, 1], got {params.revisit_decay}")
        log_med = math.log(params.length_median) + params.length_difficulty * self.b
        self.log_med = log_med
        self.fit = _phi((math.log(params.max_len) - log_med) / params.length_sigma)  # P(correct fits)
        self.theta = params.skill0
        self.kappa = 1.0  # the spread's scale (grows with `polarise`)
        if not 0.0 <= params.polarise <= 1.0:
            raise ValueError(f"polarise must be in [0, 1], got {params.polarise}")
        if not 0.0 <= params.eval_threshold < 1.0:
            raise ValueError(f"eval_threshold must be in [0, 1), got {params.eval_threshold}")
        if params.polarise_law not in POLARISE_LAWS:
            raise ValueError(f"unknown polarise law '{params.polarise_law}'; allowed: {', '.join(POLARISE_LAWS)}")
        self.g = 0.0  # the learnability's weight (grows with `polarise` under the add law)
        self.v = np.zeros(m)
        if params.polarise > 0 and params.polarise_law == "add":  # a separate stream, as for tasks and features
            self.v = np.random.default_rng([seed, 61]).standard_normal(m)
        self.n_ref = prompts_per_step * num_generations
        self.n = num_generations
        self.train_uids = [f"k{self.task[i]}:t{i}" if k else f"t{i}" for i in range(params.n_train)]
        self.index = {u: i for i, u in enumerate(self.train_uids)}
        self.eval_idx = np.arange(params.n_train, m)
        self.rng = np.random.default_rng([seed, 29])

    # ----------------------------------------------------------------- truth
    def _logit(self, idx: np.ndarray | int) -> np.ndarray:
        """a_i * (theta + phi_task + delta_i - kappa * b_i + g * v_i): the item-response logit of prompts idx."""
        return self.a[idx] * (self.theta + self.phi[self.task[idx]] + self.delta[idx] - self.kappa * self.b[idx]
                              + self.g * self.v[idx])

    def solve_rate(self, idx: np.ndarray) -> np.ndarray:
        z = self._logit(idx)
        # exp capped below its float range (a rate of 1e-304 there): a very low skill or wide spread is no overflow
        return np.where(self.solvable[idx], 1.0 / (1.0 + np.exp(np.minimum(-z, 700.0))), 0.0) * self.fit[idx]

    def eval_accuracy(self) -> float:
        """The mean solve rate of the held-out prompts (sampled answers), or with eval_threshold t > 0 the
        share of them whose rate is above t: a stand-in for greedy evaluation, where a prompt counts
        once its correct answer is the most likely one."""
        q = self.solve_rate(self.eval_idx)
        return float((q > self.p.eval_threshold).mean()) if self.p.eval_threshold > 0 else float(q.mean())

    def mean_length(self) -> float:
        """Expected response length at the start (for a default token budget): E[min(length, max_len)]."""
        i = np.arange(self.p.n_train)
        q = self.solve_rate(i) / np.maximum(self.fit[i], 1e-9)
        s, cap = max(self.p.length_sigma, 1e-9), self.p.max_len

        def capped(log_m: np.ndarray) -> np.ndarray:  # E[min(X, cap)], X log-normal with median exp(log_m)
            z = (math.log(cap) - log_m) / s
            return np.exp(log_m + s * s / 2) * _phi(z - s) + cap * (1.0 - _phi(z))

        wrong = capped(self.log_med[i] + math.log(self.p.wrong_length_factor))
        return float((q * capped(self.log_med[i]) + (1 - q) * wrong).mean())

    # ----------------------------------------------------------------- engine + rewarder
    def generate(self, req: Request) -> GroupResult:
        i = self.index[req.uid]
        z = float(self._logit(i))
        q = 1.0 / (1.0 + math.exp(min(-z, 700.0))) if self.solvable[i] else 0.0  # capped as in solve_rate
        correct = self.rng.random(req.n) < q
        med = self.log_med[i] + np.where(correct, 0.0, math.log(self.p.wrong_length_factor))
        lengths = np.exp(med + self.p.length_sigma * self.rng.standard_normal(req.n))
        cap = req.max_new_tokens or self.p.max_len
        truncated = lengths >= cap
        lengths = np.minimum(np.ceil(lengths), cap).astype(int)
        rewards = (correct & ~truncated).astype(float)
        return GroupResult(req.uid, rewards.tolist(), lengths.tolist())

    # ----------------------------------------------------------------- learning
    def learn(self, groups: dict[str, list[float]], train: list[str], replay: list[str]) -> float:
        """Apply one step's update from the trained groups; returns the skill gain."""
        replayed = set(replay)
        e_total, n_trained = 0.0, 0
        e_task = np.zeros(len(self.phi))
        for uid in train:
            r = groups[uid]
            n, c = len(r), float(sum(r))
            n_trained += n
            w = 1.0
            if uid in replayed and c == 0:
                c, w = 1.0, self.p.replay_weight
                s = 4.0 * c * n / (n + 1) ** 2
            else:
                s = 4.0 * c * (n - c) / n**2 if n else 0.0
            e = w * n * s
            i = self.index[uid]
            self.delta[i] += self.p.local_lr * e / self.n
            if e > 0 and self.p.revisit_decay < 1.0:
                e *= self.p.revisit_decay ** self.trained[i]
                self.trained[i] += 1
            e_total += e
            e_task[self.task[i]] += e
        lr, law = self.p.lr, self.p.law
        if law == "signal":
            gain = lr * e_total / self.n_ref
        elif law == "mean":
            gain = lr * e_total / max(n_trained, 1)
        else:
            k = 0.25
            gain = lr * k * (1.0 - math.exp(-e_total / (k * self.n_ref)))
        total = gain
        if self.p.polarise > 0:
            if self.p.polarise_law == "add":
                self.g += self.p.polarise * gain
            else:
                self.kappa += self.p.polarise * gain / max(self.p.difficulty_sd, 1e-9)
            gain *= 1.0 - self.p.polarise
        if self.p.tasks:
            self.theta += self.p.transfer * gain
            if e_total > 0:
                self.phi += (1.0 - self.p.transfer) * gain * self.p.tasks * e_task / e_total
        else:
            self.theta += gain
        if self.p.drift > 0:
            t = self.p.n_train
            self.delta[:t] += self.rng.normal(0.0, self.p.drift, t)
        return total
