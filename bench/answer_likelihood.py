"""Does the policy's own probability of the gold answer tell a prompt's solve rate before it is
rolled out?

A rollout costs a prefill and up to `max_completion_length` decode steps per sample; the
log-probability of the gold answer after the prompt costs one forward pass over the prompt and
a few answer tokens, for all samples. If it predicts the solve rate well, the planner could
score candidates with it (it follows the current weights, unlike the prompt's length).

This bench reads the 320 prompts and their counts of correct answers out of 8 from
`bench/prior_features.py` (bench/out/prior_features.json, base model), computes, for each
prompt, the base model's summed and mean log-probability of the gold answer tokens after the
prompt (directly, and after "The answer is "), and asks by 5-fold cross-validation over prompts
how much of the non-noise variance of the observed share correct each feature explains, alone
and next to the prompt's length (logistic per task, as in prior_features.py). Writes
bench/out/answer_likelihood.json.

    .venv/bin/python bench/prior_features.py          # once, 4 min: the counts
    .venv/bin/python bench/answer_likelihood.py       # about 1.5 min
    .venv/bin/python bench/answer_likelihood.py --replay    # the planner with it as a prior, seconds

`--replay` plays the default job's planner against those prompts at their measured rates, as
`bench/prior_features.py --replay` does, with no prior feature, with the prompt's length and with
minus the answer's log-probability ("the answer is" prefix) as `length_prior`'s covariate, paired
over 50 seeds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from fixed_weights import default_job  # bench/fixed_weights.py
from prior_features import logistic_fit  # bench/prior_features.py

PREFIXES = {"direct": "", "the answer is": "The answer is "}


@torch.no_grad()
def answer_logprobs(run, uid: str, prefix: str) -> tuple[float, int]:
    """Summed log-probability of the gold answer's tokens after the prompt and `prefix`, and
    how many tokens the answer has."""
    from rollwise.rewards.verifiers import gold_answer

    prompt = list(run.ids_by_uid[uid])
    pre = run.tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else []
    ans = run.tokenizer(gold_answer(run.items_by_uid[uid]), add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + pre + ans])
    logits = run.model(input_ids=ids).logits[0, -len(ans) - 1:-1].float()
    lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ans)[:, None]).sum()
    return float(lp), len(ans)


def explained(x: np.ndarray, c: np.ndarray, n: int, tasks: list[str], seed: int = 0) -> tuple[float, float]:
    """(Brier, share of the non-noise variance explained) of a per-task logistic fit on columns
    `x` [m, d] (each standardised within its task), 5-fold cross-validated over prompts."""
    names = sorted(set(tasks))
    onehot = np.stack([np.array([t == k for t in tasks], dtype=float) for k in names], 1)
    z = x.copy()
    for k in names:
        m = onehot[:, names.index(k)] > 0
        z[m] = (x[m] - x[m].mean(0)) / (x[m].std(0) + 1e-9)
    design = np.concatenate([onehot] + [onehot * z[:, j:j + 1] for j in range(z.shape[1])], 1)
    folds = np.arange(len(c)) % 5
    np.random.default_rng(seed).shuffle(folds)
    pred = np.zeros(len(c))
    for f in range(5):
        tr, te = folds != f, folds == f
        w = logistic_fit(design[tr], c[tr], n)
        pred[te] = 1 / (1 + np.exp(-design[te] @ w))
    obs = c / n
    noise = float(np.mean(obs * (1 - obs)) / (n - 1))
    total = float(np.var(obs))
    brier = float(np.mean((pred - obs) ** 2))
    return brier, (total - brier) / (total - noise)


def replay(seeds: int = 50, steps: int = 40) -> None:
    """The planner at fixed weights with each prior feature (module docstring)."""
    from fixed_weights import replay_with_prior

    data = json.loads(Path("bench/out/prior_features.json").read_text())
    lik = json.loads(Path("bench/out/answer_likelihood.json").read_text())["per_prompt"]["the answer is: sum"]
    rows, n = data["per_prompt"], data["samples"]
    uids = [f"{r['task']}:{i}" for i, r in enumerate(rows)]
    q = {u: (r["correct"] + 0.5) / (n + 1) for u, r in zip(uids, rows)}
    covs = {"none": None, "length": [r["length"] for r in rows], "answer log-prob": [-x for x in lik]}
    res = {name: replay_with_prior(uids, q, cov, seeds, steps) for name, cov in covs.items()}
    print(f"replay: adaptive on the {len(uids)} measured prompts, 8 x 8, {steps} steps, {seeds} seeds")
    print(f"{'prior feature':18s} {'effective ratio':>15s} {'informative rollouts':>20s} {'mean rate of requests':>21s}")
    for name, a in res.items():
        d = a - res["none"]
        se = d.std(axis=0, ddof=1) / np.sqrt(len(d))
        extra = "" if name == "none" else f"   vs none {d[:, 0].mean():+.3f} (SE {se[0]:.3f}), {d[:, 1].mean():+.1f} ({se[1]:.1f})"
        print(f"{name:18s} {a[:, 0].mean():15.3f} {a[:, 1].mean():20.1f} {a[:, 2].mean():21.3f}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="weights to score with (default: the base model)")
    ap.add_argument("--replay", action="store_true", help="only the planner replay on the saved measurements")
    args = ap.parse_args()
    if args.replay:
        replay()
        return
    data = json.loads(Path("bench/out/prior_features.json").read_text())
    rows, n = data["per_prompt"], data["samples"]
    run, _ = default_job("answer-lik-", checkpoint=args.checkpoint, dtype="bfloat16")
    run.model.eval()
    t0 = time.perf_counter()
    feats: dict[str, np.ndarray] = {}
    for name, prefix in PREFIXES.items():
        s, k = zip(*(answer_logprobs(run, r["uid"], prefix) for r in rows))
        feats[f"{name}: sum"] = np.array(s)
        feats[f"{name}: mean"] = np.array(s) / np.array(k)
    secs = time.perf_counter() - t0
    run.runner.close()
    tasks = [r["task"] for r in rows]
    c = np.array([r["correct"] for r in rows], dtype=float)
    length = np.array([r["length"] for r in rows], dtype=float)[:, None]
    print(f"{len(rows)} prompts, {len(PREFIXES)} prefixes scored in {secs:.1f} s "
          f"({secs / len(rows) / len(PREFIXES) * 1000:.0f} ms per prompt and prefix, one at a time)")
    res = {"prompts": len(rows), "seconds": secs, "features": {}}
    print(f"{'feature (per task, standardised)':40s} {'Brier':>7s} {'explained':>9s} {'with length':>11s} "
          f"{'corr with share':>15s}")
    b0, e0 = explained(length, c, n, tasks)
    print(f"{'length only':40s} {b0:7.4f} {e0:9.2f}")
    for name, f in feats.items():
        b, e = explained(f[:, None], c, n, tasks)
        bl, el = explained(np.concatenate([f[:, None], length], 1), c, n, tasks)
        r = float(np.corrcoef(f, c / n)[0, 1])
        res["features"][name] = {"brier": b, "explained": e, "explained_with_length": el, "corr": r}
        print(f"{name:40s} {b:7.4f} {e:9.2f} {el:11.2f} {r:15.2f}")
    res["length_only"] = {"brier": b0, "explained": e0}
    res["per_prompt"] = {name: f.tolist() for name, f in feats.items()}
    Path("bench/out/answer_likelihood.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
