"""Audit of `rollwise simulate --fit`: parameter recovery from runs the simulator itself made."""

from __future__ import annotations

import numpy as np

from rollwise.sim.fit import LR_PROFILE, Visit, _fit, fit_world
from rollwise.sim.world import SimParams, World


def _visits(p: SimParams, seed: int, n: int = 8) -> list[Visit]:
    w = World(p, seed, 8, n)
    rng = np.random.default_rng(seed + 1)
    q = w.solve_rate(np.arange(p.n_train))
    return [Visit("k0", "".join("1" if x else "0" for x in rng.random(n) < qi), 1) for qi in q]


def test_the_unsolvable_shares_interval_is_the_profile_cut_even_where_it_is_narrower_than_the_grid() -> None:
    # 3,000 groups of 8 at a moderate skill: all-wrong groups are mostly the unsolvable ones, so the
    # profile of u is a few hundredths wide, narrower than the 0.05 grid it is computed on. Its ends must
    # still be where the likelihood-ratio drop from the best fit reaches 3.84 (a linear interpolation
    # between grid points put the upper end at the best share itself when that lay between two points)
    p = SimParams(n_train=3000, skill0=0.5, difficulty_sd=1.0, unsolvable=0.12)
    visits = _visits(p, 2)
    fit = fit_world(visits)
    lo, hi = fit.unsolvable_interval
    assert lo < fit.unsolvable < hi and 0.02 < hi - lo < 0.08, (lo, fit.unsolvable, hi)
    top = _fit(visits, 1.5, None, 20, False).loglik
    for end in (lo, hi):
        drop = 2.0 * (top - _fit(visits, 1.5, end, 20, False).loglik)
        assert abs(drop - LR_PROFILE) < 0.5, (end, drop)
    assert lo < 0.12 < hi
