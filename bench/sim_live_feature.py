"""What a feature that follows the policy would be worth to `adaptive`, in the simulator.

`bench/answer_likelihood.py` measured that the policy's own log-probability of a prompt's gold
answer explains about half of the non-noise spread of solve rates at the base weights. Unlike a
prompt's length it follows the weights as they train. This bench gives each simulated prompt such
a live feature, recomputed before every step from the world's current item-response logits:

    x_i(t) = rho * standardised logit_i(t) + sqrt(1 - rho^2) * e_i      (e_i fixed per prompt)

and hands it to the `irt` estimator's covariate slot (`length_prior`), whose slope is learned
from the seen prompts as in real training. rho = 0 is the static feature of `--feature-r2 0.5`.
Law `signal`, the default world, share of uniform's rollouts to reach its final held-out accuracy
and effective ratio, mean over seeds:

    .venv/bin/python bench/sim_live_feature.py --rho 0 0.7 0.9 1.0 --seeds 10     # about 2 min on 2 cores
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

import rollwise.sim.runner as runner
from rollwise.sim.world import SimParams, World

RHO = [0.0]


class LiveWorld(World):
    def __init__(self, params, seed, *a):
        super().__init__(params, seed, *a)
        self.noise = np.random.default_rng([seed, 99]).standard_normal(params.n_train)


def play_step_live(planner, world, step, overlap):
    est = getattr(planner.estimator, "belief", planner.estimator)
    rho = RHO[0]
    if rho > 0 and getattr(est, "uses_covariate", False):
        logit = world._logit(np.arange(world.p.n_train))
        x = rho * (logit - logit.mean()) / logit.std() + np.sqrt(1 - rho**2) * world.noise
        est.z = (x - x.mean()) / x.std()
    return PLAY(planner, world, step, overlap)


PLAY = runner.play_step
runner.play_step, runner.World = play_step_live, LiveWorld


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rho", type=float, nargs="+", default=[0.0, 0.7, 0.9, 1.0])
    ap.add_argument("--seeds", type=int, default=10)
    args = ap.parse_args()
    base = runner.RunSpec("uniform", 0, params=SimParams(feature_r2=0.5))
    seeds = list(range(args.seeds))
    uni = runner.run_many(base, ["uniform"], seeds, workers=2)["uniform"]
    print(f"{'rho':>5s} {'share':>6s} {'effective ratio':>15s}   (adaptive:length_prior=true, {args.seeds} seeds)")
    for rho in args.rho:
        RHO[0] = rho
        res = runner.run_many(replace(base, planner={"length_prior": True}), ["adaptive"], seeds, workers=2)["adaptive"]
        shares = []
        for u, r in zip(uni, res):
            hit = np.flatnonzero(r.accuracy >= u.accuracy[-1])
            shares.append(r.rollouts[hit[0]] / u.rollouts[-1] if len(hit) else np.nan)
        print(f"{rho:5.2f} {np.nanmean(shares):6.3f} {np.mean([r.effective / r.generated for r in res]):15.3f}")


if __name__ == "__main__":
    main()
