"""Where a strategy's rollouts go in the simulator, and how good its beliefs are.

For each visit of a prompt (all requests of one prompt in one step) it records the prompt's
true solve rate, the planner's belief (posterior mean at the start of the visit), the
rollouts spent and the rewards. It prints:

1. rollouts and wasted rollouts (groups with equal rewards) by true solve rate;
2. calibration: the true mean solve rate of the prompts in each belief bin;
3. revisit residuals (successes - n * belief, per rollout) by the effective samples the
   policy was trained on at the prompt's previous visit, 4c(n-c)/n: a prompt that gets
   easier because it was trained on (beyond the global level that the irt belief follows)
   shows up as a positive residual that grows with that amount.

    .venv/bin/python bench/sim_calibration.py                        # adaptive, seeds 0-3
    .venv/bin/python bench/sim_calibration.py --strategy adaptive:estimator=oracle

The run is the same as `rollwise simulate`'s (`run_one`); the world and the planner are
wrapped only to record.
"""

from __future__ import annotations

import argparse

import numpy as np

import rollwise.sim.runner as runner
from rollwise.sim.command import parse_strategy
from rollwise.sim.world import World

BINS = [0.0, 0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98, 1.0001]


class RecordingWorld(World):
    planner = None  # set by the build_planner wrapper below
    made: list[RecordingWorld] = []

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        RecordingWorld.made.append(self)
        self.visits: list[tuple[float, float, int, int, float]] = []  # q, belief, n, c, previous trained e
        self._open: dict[str, list[float]] = {}
        self._last_e: dict[str, float] = {}

    def generate(self, req):
        res = super().generate(req)
        v = self._open.get(req.uid)
        if v is None:
            pl = RecordingWorld.planner
            i = self.index[req.uid]
            q = float(self.solve_rate(np.array([i]))[0])
            b = float(pl.estimator.mean(np.array(pl.indices([req.uid])))[0])
            v = self._open[req.uid] = [q, b, 0, 0]
        v[2] += len(res.rewards)
        v[3] += int(sum(res.rewards))
        return res

    def learn(self, groups, train, replay):
        trained = set(train)
        for uid, (q, b, n, c) in self._open.items():
            self.visits.append((q, b, n, c, self._last_e.get(uid, -1.0)))
            self._last_e[uid] = 4.0 * c * (n - c) / n if uid in trained and n else 0.0
        self._open = {}
        return super().learn(groups, train, replay)


def binned(x: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """('[lo, hi)', mask) for each non-empty bin of BINS."""
    out = []
    for lo, hi in zip(BINS[:-1], BINS[1:]):
        m = (x >= lo) & (x < hi)
        if m.any():
            out.append((f"[{lo:.2f}, {min(hi, 1):.2f})", m))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategy", default="adaptive", help="NAME[:KEY=VALUE...] as in rollwise simulate")
    ap.add_argument("--seeds", type=int, default=4)
    a = ap.parse_args()
    name, over = parse_strategy(a.strategy)
    build = runner.build_planner

    def recording_build(*args, **kw):
        RecordingWorld.planner = build(*args, **kw)
        return RecordingWorld.planner

    runner.build_planner, runner.World = recording_build, RecordingWorld
    for seed in range(a.seeds):
        runner.run_one(runner.RunSpec(strategy=name, seed=seed, planner=over))
    v = np.array([row for w in RecordingWorld.made for row in w.visits])
    q, b, n, c, prev = v.T
    wasted = (c == 0) | (c == n)
    total = n.sum()
    print(f"{a.strategy}, {a.seeds} seeds, {len(v)} visits, {int(total)} rollouts; "
          f"wasted (equal rewards) {n[wasted].sum() / total:.3f}\n")
    print("| true solve rate | visits | share of rollouts | wasted share | mean belief |")
    print("|---|---|---|---|---|")
    for label, m in binned(q):
        print(f"| {label} | {m.sum()} | {n[m].sum() / total:.3f} | {n[m & wasted].sum() / total:.3f} | {b[m].mean():.3f} |")
    print("\n| belief | visits | mean belief | true mean |")
    print("|---|---|---|---|")
    for label, m in binned(b):
        print(f"| {label} | {m.sum()} | {b[m].mean():.3f} | {q[m].mean():.3f} |")
    print("\n| trained at the previous visit (4c(n-c)/n) | revisits | residual per rollout |")
    print("|---|---|---|")
    for lo, hi in [(0, 0), (1e-9, 4), (4, 8), (8, 1e9)]:
        m = (prev == 0) if hi == 0 else (prev >= lo) & (prev < hi)
        if m.any():
            label = "0 (all-equal or not trained)" if hi == 0 else f"[{lo:g}, {hi:g})"
            print(f"| {label} | {m.sum()} | {(c[m] - n[m] * b[m]).sum() / n[m].sum():+.4f} |")


if __name__ == "__main__":
    main()
