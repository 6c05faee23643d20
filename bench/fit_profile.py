"""How often `rollwise simulate --fit`'s unsolvable-share interval holds the truth, against the test's choice.

A first visit cannot tell a prompt at a zero rate from one in a hard tail, so the fit's likelihood-ratio
test (keep a share u > 0 only where it beats u = 0 at 5%) can pick the wrong branch, and the SEs printed
with the fit hold only given that pick. The fit now also gives the 95% profile-likelihood interval of u
and the range of skill0 across it. This draws worlds from the simulator's own model (one first visit of
every prompt, groups of 8, or of 2 and 8), fits each, and counts per world:

- how often the test keeps a share when the world has one (and drops it when it has none);
- how often the profile interval of u holds the true share;
- how often skill0 +- 1.96 SE holds the true level, and how often the skill0 range across the interval does.

    .venv/bin/python bench/fit_profile.py --seeds 20          # about 5 min on 2 cores

The true level is skill0 minus the drawn prompts' mean difficulty (what the fit estimates).
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from rollwise.sim.fit import Visit, fit_world
from rollwise.sim.world import SimParams, World

# (prompts, unsolvable share, difficulty sd, skill0, group sizes): the audit's world (3,000 groups, 30%,
# sd 2.5, the simulator's default skill0) first, then harder, narrower, smaller and probe-sized ones
WORLDS = [(3000, 0.3, 2.5, 0.1, (8,)), (3000, 0.3, 2.5, -1.0, (8,)), (600, 0.3, 1.0, -1.0, (8,)),
          (600, 0.0, 1.0, -1.0, (8,)), (1000, 0.1, 2.5, -1.0, (8,)), (200, 0.3, 2.5, -1.0, (8,)),
          (1000, 0.3, 1.0, -1.0, (2, 8))]


def draw(n: int, u: float, sd: float, skill0: float, sizes: tuple[int, ...], seed: int) -> tuple[float, list[Visit]]:
    p = SimParams(n_train=n, skill0=skill0, difficulty_sd=sd, unsolvable=u)
    w = World(p, seed, 8, 8)
    rng = np.random.default_rng(seed + 100)
    q = w.solve_rate(np.arange(n))
    visits = [Visit("k0", "".join("1" if x else "0" for x in rng.random(int(rng.choice(sizes))) < q[i]), 1)
              for i in range(n)]
    return p.skill0 - float(w.b[:n].mean()), visits


def one(job: tuple) -> dict[str, bool]:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    (n, u, sd, skill0, sizes), seed = job
    level, visits = draw(n, u, sd, skill0, sizes, seed)
    fit = fit_world(visits)
    lo, hi = fit.unsolvable_interval
    k_lo, k_hi = fit.skill0_range
    se = fit.se_skill0 or 0.0
    return {"branch": (fit.unsolvable > 0) == (u > 0), "u_in": lo - 1e-9 <= u <= hi + 1e-9,
            "se_in": abs(fit.skill0 - level) <= 1.96 * se, "range_in": k_lo - 1.96 * se <= level <= k_hi + 1.96 * se,
            "width": hi - lo}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    jobs = [(w, s) for w in WORLDS for s in range(args.seeds)]
    with ProcessPoolExecutor(args.workers) as ex:
        res = list(ex.map(one, jobs))
    print(f"{args.seeds} seeds per world, one first visit per prompt\n")
    print("| prompts | unsolvable | difficulty sd | skill0 | group sizes | test's branch right | u in its 95% interval "
          "| mean interval width | skill0 in +-1.96 SE | skill0 in the range across the interval (+-1.96 SE) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, (n, u, sd, skill0, sizes) in enumerate(WORLDS):
        r = res[i * args.seeds:(i + 1) * args.seeds]

        def share(k: str, r: list = r) -> str:
            return f"{sum(x[k] for x in r)}/{len(r)}"

        print(f"| {n} | {u} | {sd} | {skill0} | {' or '.join(map(str, sizes))} | {share('branch')} | {share('u_in')} "
              f"| {np.mean([x['width'] for x in r]):.2f} | {share('se_in')} | {share('range_in')} |")


if __name__ == "__main__":
    main()
