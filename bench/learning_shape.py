"""How does training move a prompt's solve rate? Three models of the same 300 prompts before and after.

`bench/zero_rate_prompts.py` measured every held-out prompt of the default job twice, with the
base model and with the default job's step-40 checkpoint (8 samples each, temperature 1). The
simulator assumes training shifts every prompt's logit by the same amount (a global skill), so
the spread of difficulty stays what it was, and that unsolvable prompts stay unsolvable. Here
three models of the pairs (c_base, c_40) of correct answers are fitted by maximum likelihood,
each prompt with a latent difficulty z ~ N(0, 1) shared by both measurements:

- shift:      logit = a (m_t - s z) at base, a (m_t + d - s z) at step 40 (the simulator's law);
- polarise:   a (m_t - s0 z) at base, a (m_t + d - s1 z) at step 40 (the spread may change, the
              order of prompts is kept);
- polarise + stuck: as polarise, plus a share u of prompts at a zero rate at both times.

It prints each model's log-likelihood and AIC, its parameters, and the transition table it
predicts (prompts with none / some correct at base and at step 40) next to the measured one.

    .venv/bin/python bench/learning_shape.py           # seconds, reads bench/out/zero_rate_prompts.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch


def fit(data: dict, model: str) -> tuple[float, dict, np.ndarray]:
    rows = data["per_prompt"]
    n = data["samples"]
    tasks = sorted({r["task"] for r in rows})
    t = torch.tensor([tasks.index(r["task"]) for r in rows])
    c0 = torch.tensor([r["base"] for r in rows], dtype=torch.float64)
    c1 = torch.tensor([r["trained"] for r in rows], dtype=torch.float64)
    zs, zw = np.polynomial.hermite_e.hermegauss(48)
    xs, xw = np.polynomial.hermite_e.hermegauss(7)
    z = torch.tensor(np.repeat(zs, len(xs)), dtype=torch.float64)
    a = torch.tensor(np.tile(np.exp(math.log(1.5) + 0.25 * xs), len(zs)), dtype=torch.float64)
    lw = torch.tensor(np.log(np.outer(zw, xw).ravel() / (zw.sum() * xw.sum())), dtype=torch.float64)
    k = len(tasks)
    ls = torch.nn.functional.logsigmoid

    def parts(th: torch.Tensor) -> tuple:
        m, d, s0 = th[:k], th[k], torch.exp(th[k + 1])
        s1 = torch.exp(th[k + 2]) if model != "shift" else s0
        u = torch.sigmoid(th[k + 3]) if model == "polarise + stuck" else torch.tensor(0.0, dtype=torch.float64)
        return m, d, s0, s1, u

    def nll(th: torch.Tensor) -> torch.Tensor:
        m, d, s0, s1, u = parts(th)
        l0 = a[None] * (m[t][:, None] - s0 * z[None])
        l1 = a[None] * ((m[t] + d)[:, None] - s1 * z[None])
        ll = c0[:, None] * ls(l0) + (n - c0)[:, None] * ls(-l0) + c1[:, None] * ls(l1) + (n - c1)[:, None] * ls(-l1)
        solv = torch.logsumexp(ll + lw[None], 1) + torch.log1p(-u)
        both_zero = (c0 == 0) & (c1 == 0)
        out = torch.where(both_zero, torch.logaddexp(solv, torch.log(u.clamp_min(1e-300)).expand_as(solv)), solv)
        return -out.sum()

    best = None
    for u0 in ((-2.0, 0.5) if model == "polarise + stuck" else (0.0,)):
        th = torch.tensor([-2.0] * k + [1.0, 0.0, 0.0, u0], dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([th], max_iter=300, tolerance_grad=1e-10, tolerance_change=1e-14,
                                line_search_fn="strong_wolfe")

        def closure(th: torch.Tensor = th, opt=opt) -> torch.Tensor:
            opt.zero_grad()
            loss = nll(th)
            loss.backward()
            return loss

        opt.step(closure)
        v = float(nll(th.detach()))
        if best is None or v < best[0]:
            best = (v, th.detach().clone())
    v, th = best
    m, d, s0, s1, u = parts(th)
    free = k + {"shift": 2, "polarise": 3, "polarise + stuck": 4}[model]
    params = {"levels at base": [round(x, 2) for x in m.tolist()], "shift d": round(float(d), 2),
              "spread at base": round(float(s0), 2), "spread at step 40": round(float(s1), 2),
              "stuck share": round(float(u), 3), "parameters": free}
    # the transition table the model predicts, by simulation
    rng = np.random.default_rng(0)
    size = 200_000
    tt = rng.integers(0, k, size)
    zz = rng.standard_normal(size)
    aa = np.exp(rng.normal(math.log(1.5), 0.25, size))
    q0 = 1 / (1 + np.exp(-aa * (m.numpy()[tt] - float(s0) * zz)))
    q1 = 1 / (1 + np.exp(-aa * (m.numpy()[tt] + float(d) - float(s1) * zz)))
    stuck = rng.random(size) < float(u)
    q0[stuck], q1[stuck] = 0.0, 0.0
    b0, b1 = rng.binomial(n, q0), rng.binomial(n, q1)
    table = np.array([[np.mean((b0 == 0) & (b1 == 0)), np.mean((b0 == 0) & (b1 > 0))],
                      [np.mean((b0 > 0) & (b1 == 0)), np.mean((b0 > 0) & (b1 > 0))]])
    extra = np.array([np.mean(b1 == n), np.mean(b1 == 0)])
    return v, params, np.concatenate([table.ravel(), extra])


def main() -> None:
    source = Path("bench/out/zero_rate_prompts.json")
    if not source.exists():
        sys.exit(f"learning_shape.py: {source} is missing (run from the repository root, after "
                 "bench/zero_rate_prompts.py, which writes it)")
    data = json.loads(source.read_text())
    n = data["samples"]
    c0 = np.array([r["base"] for r in data["per_prompt"]])
    c1 = np.array([r["trained"] for r in data["per_prompt"]])
    measured = np.array([np.mean((c0 == 0) & (c1 == 0)), np.mean((c0 == 0) & (c1 > 0)),
                         np.mean((c0 > 0) & (c1 == 0)), np.mean((c0 > 0) & (c1 > 0)),
                         np.mean(c1 == n), np.mean(c1 == 0)])
    head = "none→none | none→some | some→none | some→some | all correct at 40 | none at 40"
    print(f"{len(c0)} prompts x {n} samples, base and {data['checkpoint']}\n")
    print(f"| model | log-likelihood | AIC | {head} |")
    print("|---|---|---|" + "---|" * 6)
    print("| measured | | | " + " | ".join(f"{x:.3f}" for x in measured) + " |")
    details = []
    for model in ("shift", "polarise", "polarise + stuck"):
        v, params, pred = fit(data, model)
        print(f"| {model} | {-v:.1f} | {2 * v + 2 * params['parameters']:.1f} | " + " | ".join(f"{x:.3f}" for x in pred) + " |")
        details.append((model, params))
    print()
    for model, params in details:
        print(f"{model}: {params}")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    main()
