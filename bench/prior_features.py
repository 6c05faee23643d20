"""How much of a prompt's solve rate can be told before it is rolled out, from what the planner
could know: its task and its length.

In the default job most of the 4,000 training prompts are seen once, so the planner's belief
about a prompt is mostly its prior (the `irt` estimator's per-task prior). This bench samples
`--samples` responses to `--prompts` training prompts of the default mixture with the base model
(bf16, 2 threads, the default job's sampling settings), counts the correct ones, and asks how
well three priors predict each prompt's count, by 5-fold cross-validation over prompts:

- pool: one solve rate for all prompts;
- task: one per task (what `group_prior` learns);
- task + length: a logistic fit per task on the prompt's token length.

It prints the binomial log-likelihood per prompt and the Brier score of each prior against the
observed share correct, and the share of the between-prompt variance (beyond binomial noise)
that each explains. Then the planner's own `irt` estimator (per-task prior, with and without
`length_prior`) is given the counts of half the prompts, as if they had been rolled out, and
predicts the other half; the Brier score of those predictions is printed over 20 random
halves. Writes bench/out/prior_features.json (with every prompt's count).

    .venv/bin/python bench/prior_features.py                 # 320 prompts x 8 samples, ~4 min
    .venv/bin/python bench/prior_features.py --replay        # the planner on those prompts, seconds

`--replay` plays the default job's planner (8 prompts x 8 samples a step, 40 steps) against
those 320 prompts at fixed weights, each prompt solved with its measured rate (c + 0.5) / (n + 1),
with and without `length_prior`, paired over 50 seeds: the effective ratio and the rollouts in
informative groups. No model is loaded.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from fixed_weights import count_correct, default_job, replay_with_prior  # bench/fixed_weights.py


def logistic_fit(x: np.ndarray, c: np.ndarray, n: int, iters: int = 50, ridge: float = 1e-3) -> np.ndarray:
    """Binomial logistic regression (Newton, a small ridge) of counts c of n on features x [m, d]."""
    w = np.zeros(x.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-x @ w))
        g = x.T @ (c - n * p) - ridge * w
        h = (x * (n * p * (1 - p))[:, None]).T @ x + ridge * np.eye(x.shape[1])
        w = w + np.linalg.solve(h, g)
    return w


def design(tasks: list[str], lengths: np.ndarray, names: list[str], with_length: bool,
           mu: dict[str, float], sd: dict[str, float]) -> np.ndarray:
    cols = [np.array([t == k for t in tasks], dtype=float) for k in names]
    if with_length:
        z = np.array([(ln - mu[t]) / sd[t] for t, ln in zip(tasks, lengths)])
        cols += [np.array([t == k for t in tasks], dtype=float) * z for k in names]
    return np.stack(cols, axis=1)


def irt_unseen(tasks: list[str], lengths: np.ndarray, c: np.ndarray, n: int, obs: np.ndarray,
               uids: list[str]) -> dict[str, float]:
    """Brier score of the irt estimator's belief about prompts it has not seen, given the others'
    counts (one update each, then one after_step, as after a step), over 20 random halves."""
    from rollwise.planner.irt import IRTEstimator

    out: dict[str, list[float]] = {"task prior": [], "task prior + length_prior": []}
    groups = [f"{t}" for t in tasks]
    for rep in range(20):
        seen = np.random.default_rng(100 + rep).random(len(uids)) < 0.5
        for key, cov in (("task prior", None), ("task prior + length_prior", lengths)):
            e = IRTEstimator(len(uids), groups=groups, covariate=cov)
            for i in np.flatnonzero(seen):
                e.update(int(i), int(c[i]), n)
            e.after_step()
            e.after_step()  # a second EM step on the same evidence (the level does not move: no revisits)
            un = np.flatnonzero(~seen)
            out[key].append(float(np.mean((e.mean(un) - obs[un]) ** 2)))
    print("\nirt estimator, Brier score on the unseen half (mean over 20 halves):")
    res = {}
    for key, v in out.items():
        res[key] = float(np.mean(v))
        print(f"  {key:28s} {np.mean(v):.4f}")
    d = np.array(out["task prior + length_prior"]) - np.array(out["task prior"])
    print(f"  difference {d.mean():+.4f} (SE {d.std(ddof=1) / np.sqrt(len(d)):.4f}, lower on {(d < 0).sum()}/20)")
    return res


def replay(seeds: int = 50, steps: int = 40) -> None:
    """The planner against the measured prompts at fixed weights (module docstring)."""
    data = json.loads(Path("bench/out/prior_features.json").read_text())
    rows, n = data["per_prompt"], data["samples"]
    uids = [f"{r['task']}:{i}" for i, r in enumerate(rows)]
    q = {u: (r["correct"] + 0.5) / (n + 1) for u, r in zip(uids, rows)}
    lengths = [r["length"] for r in rows]
    res = {variant: replay_with_prior(uids, q, cov, seeds, steps)
           for variant, cov in (("adaptive", None), ("adaptive:length_prior=true", lengths))}
    print(f"\nreplay: the adaptive planner on the {len(uids)} measured prompts, 8 x 8, {steps} steps, {seeds} seeds")
    print(f"{'variant':28s} {'effective ratio':>15s} {'informative rollouts':>20s} {'mean rate of requests':>21s}")
    for v, a in res.items():
        print(f"{v:28s} {a[:, 0].mean():15.3f} {a[:, 1].mean():20.1f} {a[:, 2].mean():21.3f}")
    d = res["adaptive:length_prior=true"] - res["adaptive"]
    se = d.std(axis=0, ddof=1) / np.sqrt(len(d))
    print(f"{'difference (SE)':28s} {d[:, 0].mean():+8.3f} ({se[0]:.3f}) {d[:, 1].mean():+13.1f} ({se[1]:.1f}) "
          f"{d[:, 2].mean():+14.3f} ({se[2]:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=320)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--replay", action="store_true", help="only the planner replay on the saved measurement")
    args = ap.parse_args()
    if args.replay:
        replay()
        return
    run, cfg = default_job("prior-features-", dtype="bfloat16")
    rng = np.random.default_rng(0)
    uids = [str(u) for u in rng.choice(list(run.ids_by_uid), args.prompts, replace=False)]
    correct = count_correct(run, cfg, uids, args.samples, progress=True)
    run.runner.close()
    n = args.samples
    tasks = [run.items_by_uid[u].task for u in uids]
    lengths = np.array([len(run.ids_by_uid[u]) for u in uids], dtype=float)
    c = np.array([correct.get(u, 0) for u in uids], dtype=float)
    names = sorted(set(tasks))
    folds = np.arange(len(uids)) % 5
    rng.shuffle(folds)
    pred = {k: np.zeros(len(uids)) for k in ("pool", "task", "task + length")}
    for f in range(5):
        tr, te = folds != f, folds == f
        pred["pool"][te] = (c[tr].sum() + 0.5) / (n * tr.sum() + 1)
        t_tr = [t for t, m in zip(tasks, tr) if m]
        mu = {k: float(np.mean([ln for t, ln in zip(t_tr, lengths[tr]) if t == k] or [0])) for k in names}
        sd = {k: float(np.std([ln for t, ln in zip(t_tr, lengths[tr]) if t == k] or [1])) or 1.0 for k in names}
        for key, with_len in (("task", False), ("task + length", True)):
            x_tr = design(t_tr, lengths[tr], names, with_len, mu, sd)
            w = logistic_fit(x_tr, c[tr], n)
            x_te = design([t for t, m in zip(tasks, te) if m], lengths[te], names, with_len, mu, sd)
            pred[key][te] = 1 / (1 + np.exp(-x_te @ w))
    obs = c / n
    noise = float(np.mean(obs * (1 - obs)) * n / (n - 1) / n)  # binomial part of var(obs), unbiased
    total = float(np.var(obs))
    result = {"prompts": len(uids), "samples": n, "mean_solve_rate": float(obs.mean()),
              "var_observed": total, "var_binomial_noise": noise, "tasks": {}, "priors": {}}
    for k in names:
        m = np.array([t == k for t in tasks])
        r = np.corrcoef(lengths[m], obs[m])[0, 1] if m.sum() > 2 and np.std(obs[m]) > 0 else float("nan")
        result["tasks"][k] = {"prompts": int(m.sum()), "solve_rate": float(obs[m].mean()),
                              "length_mean": float(lengths[m].mean()), "length_sd": float(lengths[m].std()),
                              "corr_length_solve": float(r)}
    print(f"\n{len(uids)} prompts x {n} samples, mean solve rate {obs.mean():.3f}; variance of the observed rate "
          f"{total:.4f}, of which binomial noise {noise:.4f}")
    for k, v in result["tasks"].items():
        print(f"  {k:18s} {v['prompts']:4d} prompts  solve {v['solve_rate']:.3f}  length {v['length_mean']:.1f} "
              f"(sd {v['length_sd']:.1f})  corr(length, solve) {v['corr_length_solve']:+.2f}")
    print(f"\n{'prior':16s} {'loglik/prompt':>13s} {'Brier':>7s} {'explained':>9s}")
    for key, p in pred.items():
        p = np.clip(p, 1e-4, 1 - 1e-4)
        ll = float(np.mean(c * np.log(p) + (n - c) * np.log1p(-p)
                           + np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) for k in c])))
        brier = float(np.mean((p - obs) ** 2))
        explained = (total - brier) / (total - noise) if total > noise else float("nan")
        result["priors"][key] = {"loglik": ll, "brier": brier, "explained": explained}
        print(f"{key:16s} {ll:13.3f} {brier:7.4f} {explained:9.2f}")
    result["irt_unseen_brier"] = irt_unseen(tasks, lengths, c, n, obs, uids)
    result["per_prompt"] = [{"uid": u, "task": t, "length": int(ln), "correct": int(k)}
                            for u, t, ln, k in zip(uids, tasks, lengths, c)]
    Path("bench/out").mkdir(parents=True, exist_ok=True)
    Path("bench/out/prior_features.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
