"""Exploratory: should the `irt` estimator's global level also step on first visits?

The level L moves only on revisited prompts (a damped Newton step on sum(s - n*p)); the default
job barely revisits, so new prompts learn the policy's progress only through the pool prior. This
variant adds each first visit's residual against the prior predictive mean to that step. It runs
`rollwise simulate` with the estimator patched (`fv`) or as it is (`base`); same seeds, same world.

    .venv/bin/python bench/sim_irt_first_visits.py base --strategies uniform adaptive --seeds 20 --quiet
    .venv/bin/python bench/sim_irt_first_visits.py fv   --strategies uniform adaptive --seeds 20 --quiet
"""

import sys

import numpy as np

from rollwise.cli import main
from rollwise.planner.irt import IRTEstimator

_update = IRTEstimator.update


def update_with_first_visits(self: IRTEstimator, idx: int, successes: int, n: int) -> None:
    if self.n_obs[idx] == 0:  # revisits add their term inside update itself
        p = float(self.mean(np.array([idx]))[0])  # the prior predictive mean
        self._g += successes - n * p
        self._h += n * p * (1 - p)
    _update(self, idx, successes, n)


if __name__ == "__main__":
    if sys.argv[1:2] not in (["base"], ["fv"]):
        sys.exit("usage: sim_irt_first_visits.py base|fv [rollwise simulate options]")
    if sys.argv[1] == "fv":
        IRTEstimator.update = update_with_first_visits
    sys.exit(main(["simulate", *sys.argv[2:]]))
