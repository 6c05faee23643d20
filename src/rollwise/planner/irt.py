"""`IRTEstimator`: a logistic belief per prompt with a learned global level and pool prior.

Our addition (not from a paper): the estimators from the literature form a belief at a
prompt's last visit and keep it until the next one, while the policy moves on; this one
shifts every belief by the progress measured on revisited prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rollwise.planner.estimators import Estimator


class IRTEstimator(Estimator):
    """Logistic (item-response) belief with a learned global trend and a learned pool prior.

    Prompt i is solved with probability sigmoid(L + u_i): L is one global level that follows
    the policy as it improves, u_i the prompt's own offset, held on a grid plus one "never
    solved" cell (u = -inf). Each prompt keeps the log-likelihood of its rewards over the grid
    (multiplied by `decay` before each visit's term is added: MoPPS-style forgetting); its
    belief is that likelihood times the pool prior. After each step:
    - L += clip(sum(s - n*p) / (sum(n*p*(1-p)) + h0), +-max_step), h0 = 1/(4*max_step^2): a damped
      Newton step on revisited prompts, so beliefs formed visits ago follow the progress made since.
      h0 (not the clip alone) damps it: with little curvature (few revisits, or beliefs near 0 or 1)
      the clipped ratio moved L by the full clip toward the likelier outcome even when the beliefs
      were right (a revisit believed at 0.01 that scores 0/8: -0.25); the step is now linear in s;
    - the prior becomes the mean belief of the seen prompts (one EM step; empirical Bayes), so
      an unseen prompt looks like the pool and 0/8 on a hard pool means "probably hopeless".

    With `groups` (one label per prompt: the task), each group gets its own prior, the mean
    belief of its seen prompts shrunk toward the pool prior with the weight of
    `group_shrink` prompts: an unseen prompt of a task that is hard today looks hard.

    With `covariate` (one number per prompt, e.g. its token length), a prompt's prior is its
    group's shifted by beta_g * z_i, z the covariate standardised within the group: an unseen
    prompt longer than its task's usual looks harder, if the seen ones say so. After each
    step beta_g is the regression (shrunk toward 0 with the weight of `slope_shrink`) of the
    seen prompts' posterior mean offsets on z (an EM step), and the group prior is learned
    from their posteriors shifted back by beta_g * z_i.
    """

    name = "irt"

    def __init__(self, size: int, decay: float = 1.0, grid: int = 41, span: float = 10.0, max_step: float = 0.25,
                 groups: list[str] | None = None, group_shrink: float = 4.0,
                 covariate: list[float] | np.ndarray | None = None, slope_shrink: float = 4.0):
        super().__init__(size)
        self.decay, self.max_step = decay, max_step
        self.u = np.concatenate([[-np.inf], np.linspace(-span, span, grid)])
        self.loglik = np.zeros((size, len(self.u)))
        self.n_obs = np.zeros(size)
        self.level = 0.0
        names = sorted(set(groups)) if groups else [""]
        self.group = (np.array([names.index(g) for g in groups], dtype=np.int64) if groups
                      else np.zeros(size, dtype=np.int64))
        self.shrink = group_shrink
        self.prior = np.full((len(names), len(self.u)), 1.0 / len(self.u))
        self._g = self._h = 0.0
        self.z = np.zeros(size)
        self.uses_covariate = covariate is not None
        if covariate is not None:
            x = np.asarray(covariate, dtype=float)
            if x.shape != (size,):
                raise ValueError(f"covariate: one value per prompt ({size}), got shape {x.shape}")
            for k in range(len(names)):
                m = self.group == k
                sd = float(x[m].std()) if m.any() else 0.0
                self.z[m] = (x[m] - x[m].mean()) / sd if sd > 0 else 0.0
        self.beta = np.zeros(len(names))
        self.slope_shrink = slope_shrink

    def _p_grid(self) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(self.level + self.u)))

    def _shift(self, rows: np.ndarray, shift: np.ndarray) -> np.ndarray:
        """Each row's finite-offset cells moved by `shift` logits (linear interpolation on the
        grid, clamped at its ends) and rescaled to their old total; the "never" cell stays."""
        if not shift.any():
            return rows
        grid = self.u[1:]
        pos = np.clip(np.arange(len(grid))[None, :] - shift[:, None] / (grid[1] - grid[0]), 0, len(grid) - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, len(grid) - 1)
        f = pos - lo
        fin = rows[:, 1:]
        moved = (1 - f) * np.take_along_axis(fin, lo, axis=1) + f * np.take_along_axis(fin, hi, axis=1)
        total, now = fin.sum(axis=1, keepdims=True), moved.sum(axis=1, keepdims=True)
        return np.concatenate([rows[:, :1], moved * total / np.maximum(now, 1e-300)], axis=1)

    def _prior_of(self, idx: np.ndarray) -> np.ndarray:
        prior = self.prior[self.group[idx]]
        return self._shift(prior, self.beta[self.group[idx]] * self.z[idx]) if self.uses_covariate else prior

    def posterior(self, idx: np.ndarray) -> np.ndarray:
        idx = np.atleast_1d(idx)
        lp = self.loglik[idx] + np.log(np.maximum(self._prior_of(idx), 1e-300))
        post = np.exp(lp - lp.max(axis=1, keepdims=True))
        return post / post.sum(axis=1, keepdims=True)

    def mean(self, idx: np.ndarray) -> np.ndarray:
        return self.posterior(idx) @ self._p_grid()

    def count(self, idx: np.ndarray) -> np.ndarray:
        return self.n_obs[np.atleast_1d(idx)]

    def expect(self, idx: np.ndarray, f: Callable[[np.ndarray], np.ndarray], rng: np.random.Generator) -> np.ndarray:
        return self.posterior(idx) @ f(self._p_grid())

    def sample(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        cdf = np.cumsum(self.posterior(idx), axis=1)
        k = np.minimum((cdf < rng.random(len(cdf))[:, None]).sum(axis=1), len(self.u) - 1)
        half = (self.u[2] - self.u[1]) / 2
        u = self.u[k] + rng.uniform(-half, half, len(k))
        return 1.0 / (1.0 + np.exp(-(self.level + u)))

    def update(self, idx: int, successes: int, n: int) -> None:
        p_grid = np.clip(self._p_grid(), 1e-12, 1 - 1e-12)
        if self.n_obs[idx] > 0:
            p = float(self.mean(np.array([idx]))[0])
            self._g += successes - n * p
            self._h += n * p * (1 - p)
        ll = self.decay * self.loglik[idx] + successes * np.log(p_grid) + (n - successes) * np.log1p(-p_grid)
        self.loglik[idx] = ll - ll.max()
        self.n_obs[idx] = self.decay * self.n_obs[idx] + n

    def after_step(self) -> None:
        if self._h > 0:
            h0 = 1.0 / (4.0 * self.max_step**2)  # the step's noise sd is at most max_step
            self.level += float(np.clip(self._g / (self._h + h0), -self.max_step, self.max_step))
        self._g = self._h = 0.0
        seen = np.flatnonzero(self.n_obs > 0)
        if len(seen):
            post = self.posterior(seen)
            if self.uses_covariate:
                self._fit_slopes(seen, post)
                post = self._shift(post, -self.beta[self.group[seen]] * self.z[seen])
            pool = post.mean(axis=0)
            floor = 1e-3 / len(self.u)
            for k in range(len(self.prior)):
                mine = post[self.group[seen] == k]
                prior = (mine.sum(axis=0) + self.shrink * pool) / (len(mine) + self.shrink) + floor
                self.prior[k] = prior / prior.sum()

    def _fit_slopes(self, seen: np.ndarray, post: np.ndarray) -> None:
        """beta_g: weighted least squares of the seen prompts' mean offset (given solvable) on z."""
        fin = post[:, 1:]
        w = fin.sum(axis=1)  # P(solvable)
        ubar = fin @ self.u[1:] / np.maximum(w, 1e-12)
        g, z = self.group[seen], self.z[seen]
        for k in range(len(self.beta)):
            m = (g == k) & (w > 1e-6)
            if m.sum() < 2:
                continue
            wk, zk, uk = w[m], z[m], ubar[m]
            zc = zk - np.average(zk, weights=wk)
            uc = uk - np.average(uk, weights=wk)
            self.beta[k] = float((wk * zc * uc).sum() / ((wk * zc * zc).sum() + self.slope_shrink))

    def state_dict(self) -> dict[str, Any]:
        return {"loglik": self.loglik.tolist(), "n_obs": self.n_obs.tolist(), "level": self.level,
                "prior": self.prior.tolist(), "beta": self.beta.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loglik = np.asarray(state["loglik"], dtype=float).reshape(self.size, len(self.u))
        self.n_obs = np.asarray(state["n_obs"], dtype=float)
        self.level = float(state["level"])
        prior = np.asarray(state["prior"], dtype=float)
        self.prior = np.broadcast_to(prior, self.prior.shape).copy()  # a 1-D prior: states before groups
        beta = np.asarray(state.get("beta", np.zeros(len(self.beta))), dtype=float)
        if beta.shape != self.beta.shape and beta.shape != (1,):  # setup turns this into a refusal of the resume
            raise ValueError(f"the saved length slopes are for {len(beta)} task group(s), this run has {len(self.beta)} "
                             "(planner.group_prior changed?)")
        self.beta = np.broadcast_to(beta, self.beta.shape).copy()  # one pooled slope: every group starts from it
