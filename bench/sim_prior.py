"""What knowing the step-0 solve rates is worth, in the simulator (the counterpart of
bench/preregistered/prior_oracle.txt).

Runs four rows in a simulated world, every seed at uniform's rollout budget:

- uniform, and `adaptive` as it is;
- `adaptive` warm-started with `planner.prior_counts`: every training prompt's count of correct
  answers in `--samples` draws at its true solve rate before training (what bench/pool_rates.py
  measures in real training), not charged to its budget;
- `adaptive:estimator=oracle`: the true current solve rates at every step.

It prints each row's share of uniform's rollouts to reach uniform's final accuracy (mean over
seeds; "never (k/n)" when k seeds never reach it), its effective ratio, and its final accuracy
minus uniform's in units of uniform's gain (paired by seed, with its SE). The world is
`rollwise simulate`'s: give its flags after `--`, e.g. a world fitted to the real bench's uniform runs:

    .venv/bin/python bench/sim_prior.py --seeds 40 -- --fit bench/out/screen_all_cap48/uniform-seed14{1..9} \
        bench/out/screen_all_cap48/uniform-seed150 --pool 64 --steps 12 --eval-size 400
    .venv/bin/python bench/sim_prior.py --seeds 20          # the default world (1024 prompts, 150 steps)

`--measured bench/out/pool_rates/seed*.jsonl` first prints the measured pools' counts beside the
simulated world's step-0 counts, a check of the world's spread of solve rates.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from sim_reach import effective, share_text, shares  # bench/sim_reach.py

from rollwise.sim.command import add_arguments, prepare
from rollwise.sim.runner import RunResult, RunSpec, default_budget, run_one
from rollwise.sim.world import World


def step0_counts(spec: RunSpec, samples: int) -> tuple[list[str], np.ndarray]:
    """spec's world's training uids and, per prompt, Binomial(samples, its true step-0 solve rate)."""
    w = World(spec.params, spec.seed, spec.prompts_per_step, spec.num_generations)
    p = w.solve_rate(np.arange(spec.params.n_train))
    return w.train_uids, np.random.default_rng([spec.seed, 4217]).binomial(samples, p)


def counts_file(spec: RunSpec, samples: int, folder: Path) -> str:
    """A prior_counts file of spec's world and seed (step0_counts)."""
    uids, s = step0_counts(spec, samples)
    path = folder / f"seed{spec.seed}.jsonl"
    path.write_text("".join(json.dumps({"uid": u, "successes": int(k), "samples": samples}) + "\n"
                            for u, k in zip(uids, s)))
    return str(path)


BINS = [(0, 0), (1, 1), (2, 3), (4, 7), (8, 16)]  # correct of 16; scaled to other --samples


def histogram(counts: np.ndarray, samples: int) -> list[float]:
    """Share of prompts in each of BINS, read as solve rates (bin i holds a rate in (hi_{i-1}/16, hi_i/16],
    the first bin a rate of 0), so that at any number of `samples` draws each count lands in one bin and
    the shares sum to 1 (a bin may stay empty where the draws are too few to tell it apart)."""
    rate = np.asarray(counts) / samples
    tops = [hi / 16 for _, hi in BINS]
    return [float(np.mean(rate == 0))] + [float(np.mean((rate > lo) & (rate <= hi))) for lo, hi in zip(tops, tops[1:])]


def compare_counts(base: RunSpec, seeds: int, samples: int, files: list[Path]) -> None:
    """The measured pools' counts beside those the simulated world draws at step 0."""
    measured = np.array([json.loads(line)["successes"] for f in files for line in f.read_text().splitlines() if line])
    sim = np.concatenate([step0_counts(replace(base, seed=seed), samples)[1] for seed in range(seeds)])
    head = " | ".join(f"{lo}-{hi}" if lo != hi else f"{lo}" for lo, hi in BINS)
    print(f"Step-0 counts correct of {samples} (bins for 16), share of prompts:\n\n| | mean rate | {head} |\n"
          f"|---|---|{'---|' * len(BINS)}")
    for name, c in ((f"measured ({len(files)} pools, {len(measured)} prompts)", measured),
                    (f"simulated ({seeds} worlds)", sim)):
        print(f"| {name} | {c.mean() / samples:.3f} | " + " | ".join(f"{x:.2f}" for x in histogram(c, samples)) + " |")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--samples", type=int, default=16, help="draws per prompt behind the warm start")
    ap.add_argument("--measured", type=Path, nargs="*", default=[],
                    help="bench/pool_rates.py files (with --samples draws each) to set beside the simulated world's "
                    "step-0 counts: a check of the world's spread of solve rates")
    ap.add_argument("world", nargs=argparse.REMAINDER, help="-- then `rollwise simulate` world flags")
    args = ap.parse_args()
    sim = argparse.ArgumentParser()
    add_arguments(sim)
    world_args = sim.parse_args([a for a in args.world if a != "--"] + ["--strategies", "uniform"])
    _, _, params = prepare(world_args)
    base = RunSpec("uniform", 0, steps=world_args.steps, prompts_per_step=world_args.prompts_per_step,
                   num_generations=world_args.num_generations, params=params)
    base.budget = default_budget(base)
    folder = Path(tempfile.mkdtemp(prefix="sim_prior"))
    rows = {"uniform": ("uniform", {}), "adaptive": ("adaptive", {}),
            f"adaptive, step-0 counts of {args.samples}": ("adaptive", {"prior_counts": None}),
            "adaptive:estimator=oracle": ("adaptive", {"estimator": "oracle"})}
    if args.measured:
        compare_counts(base, args.seeds, args.samples, args.measured)
    res: dict[str, dict[int, RunResult]] = {}
    for label, (name, over) in rows.items():
        res[label] = {}
        for seed in range(args.seeds):
            spec = replace(base, strategy=name, seed=seed, planner=dict(over))
            if "prior_counts" in over:
                spec.planner["prior_counts"] = counts_file(spec, args.samples, folder)
            res[label][seed] = run_one(spec)
    uni = res["uniform"]
    gain = np.array([uni[s].accuracy[-1] - uni[s].accuracy[0] for s in uni])
    print(f"{args.seeds} seeds, {params.n_train} prompts, {base.prompts_per_step} x {base.num_generations} a step, "
          f"{base.steps} steps, law {params.law}, revisit decay {params.revisit_decay}; uniform: "
          f"{np.mean([r.accuracy[0] for r in uni.values()]):.3f} -> {np.mean([r.accuracy[-1] for r in uni.values()]):.3f}")
    print("\n| row | share of uniform's rollouts to reach its final | effective ratio | final - uniform, in uniform's gains (SE) |")
    print("|---|---|---|---|")
    for label, runs in res.items():
        if label == "uniform":
            print(f"| uniform | 1 | {np.mean([effective(r) for r in runs.values()]):.2f} | 0 |")
            continue
        lead = np.array([runs[s].accuracy[-1] - uni[s].accuracy[-1] for s in runs]) / np.maximum(gain, 1e-9)
        print(f"| {label} | {share_text(shares(runs, uni))} | {np.mean([effective(r) for r in runs.values()]):.2f} "
              f"| {lead.mean():+.2f} ({lead.std(ddof=1) / len(lead) ** 0.5:.2f}) |")


if __name__ == "__main__":
    main()
