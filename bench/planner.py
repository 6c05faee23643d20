"""Planner strategies in real training: held-out accuracy against rollout tokens.

    .venv/bin/python bench/planner.py --seeds 0 1            # every run, then the table and PNG
    .venv/bin/python bench/planner.py --seeds 0 --threads 1  # one seed per process, two in parallel:
    .venv/bin/python bench/planner.py --seeds 1 --threads 1  #   (tokens, not time, are compared)
    .venv/bin/python bench/planner.py --report               # table + PNG from the finished runs
    .venv/bin/python bench/planner.py --report --out A --also B C   # one table over several folders
    .venv/bin/python bench/planner.py --report --versus adaptive    # also paired with adaptive

Each strategy trains SmolLM2-135M-Instruct on the default task mixture (five reasoning-gym
tasks: the base model solves 5-10% of samples at temperature 1, 2-30% per task greedily;
bench/task_rates.py) drawn into a pool of `--train-size`
prompts. The rollout-token budget is the same for every strategy of a seed: what uniform
generates in `--uniform-steps` steps of that seed (uniform runs first), or `--tokens` if
given. Greedy held-out accuracy is measured every `--eval-every` steps on the same held-out
items (uniform: every `--uniform-eval-every` steps, ending at its last step).
A strategy is `name` or `name:key=value:...` (planner config fields), as in `rollwise simulate`;
`budget_rollouts=N` there sets that strategy's step size (`uniform:budget_rollouts=32` is uniform
with 4 prompts x 8 samples a step), its total being uniform's tokens as for every other strategy.
A run whose curve is already in the output folder is not run again.

Give answers room: add `rollout.max_completion_length=128` (as every study since
bench/preregistered/planner_cap128.txt does). At the config's default 48-token cap the base
model's greedy held-out answer is cut on about 40% of items, and about 3 of the points gained
are learning to finish inside the cap; at 128 tokens 5-7% are cut at step 0.

Writes bench/out/planner/{results.json,curves.png,mean-curves.png,table.md} (with --strategies
or --seeds in --report: the same names ending in -selection, so a subset never overwrites the
full report). The table has one row per
strategy (means over seeds) and a paired summary against uniform over the seeds both ran:
the mean difference in accuracy at uniform's tokens with its standard error (a run stopped by
the token budget ends with the step that crosses it, so its own last evaluation comes after
tokens uniform never had; it is read at uniform's total, linear between the evaluations on either
side), the share of uniform's
tokens each seed needed to reach uniform's final accuracy ("never" counts as above any share, and
so does reaching it only past uniform's tokens),
and the share on the mean curve: where the strategy's accuracy, averaged over seeds against
tokens as a share of each seed's uniform run, first reaches uniform's mean final accuracy (95%
interval from resampling seeds; mean-curves.png shows those curves).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np

from rollwise.compare import curve as run_curve
from rollwise.compare import tokens_to_reach
from rollwise.config import load_config
from rollwise.environment import compare_environments, load_environment
from rollwise.loop import train
from rollwise.sim.command import parse_strategy

DEFAULT = ["uniform", "dapo", "mopps:estimator=irt:selection_score=expected", "adaptive"]


def label(text: str) -> str:
    return text.replace(":", "+").replace("=", "-")


def curve(run_dir: Path, max_step: int | None = None) -> dict:
    """(cumulative rollout tokens, held-out accuracy) at each evaluation, and run totals (an
    effective ratio of 0 where the strategy logs none)."""
    c = run_curve(run_dir, max_step)
    return {**c, "effective_ratio": c["effective_ratio"] or 0.0}


GRID = np.linspace(0.0, 1.0, 201)


def mean_curve(uni: dict[int, dict], runs: dict[int, dict], seeds: list[int]) -> np.ndarray:
    """Mean over `seeds` of each run's accuracy on GRID, x = rollout tokens / that seed's uniform
    total: linear between evaluations, held at the last value beyond the last one."""
    rows = []
    for s in seeds:
        total = uni[s]["points"][-1][0]
        xs, ys = zip(*runs[s]["points"])
        rows.append(np.interp(GRID, np.array(xs) / total, ys))
    return np.mean(rows, axis=0)


def first_crossing(m: np.ndarray, target: float) -> float:
    """Smallest x on GRID (linear between grid points) where the curve m reaches target; inf if never."""
    hit = np.flatnonzero(m >= target - 1e-12)
    if len(hit) == 0:
        return float("inf")
    i = int(hit[0])
    if i == 0:
        return 0.0
    m0, m1 = m[i - 1], m[i]
    return float(GRID[i - 1] + (target - m0) / (m1 - m0) * (GRID[i] - GRID[i - 1]))


def mean_curve_share(uni: dict[int, dict], runs: dict[int, dict], reps: int = 2000,
                     seed: int = 0, target: str = "final") -> tuple[float, float, float, int]:
    """The share of uniform's tokens at which the strategy's mean curve over seeds first reaches
    uniform's mean final accuracy (bench/preregistered/adaptive_seeds58.txt), or with target="best"
    the highest point of uniform's mean curve (so a uniform run that gains and then falls back does
    not lower the bar), with a 95% interval from resampling seeds (a seed brings both its runs); inf
    for never. Returns (share, lo, hi, seeds)."""
    both = sorted(s for s in runs if s in uni)
    if not both:
        return float("nan"), float("nan"), float("nan"), 0
    pick_target = {"final": lambda m: float(m[-1]), "best": lambda m: float(m.max())}[target]

    def share(pick: list[int]) -> float:
        return first_crossing(mean_curve(uni, runs, pick), pick_target(mean_curve(uni, uni, pick)))

    rng = np.random.default_rng(seed)
    boot = np.array([share([both[i] for i in rng.integers(0, len(both), len(both))]) for _ in range(reps)])
    boot[~np.isfinite(boot)] = 1e9  # never: above any share
    lo, hi = (float(v) for v in np.percentile(boot, [2.5, 97.5]))
    return share(both), lo, hi, len(both)


def fmt_share(x: float) -> str:
    return "never" if not x <= 1 else f"{x:.2f}"


def at_tokens(points: list, total: float) -> float:
    """A run's held-out accuracy at `total` rollout tokens (uniform's budget): linear between the
    evaluations on either side. A run stopped by a token budget ends with the step that crosses it, so
    its last evaluation lies past uniform's total; reading it there would credit tokens uniform never
    had. A run that ended before `total` keeps its last evaluation."""
    xs, ys = zip(*points)
    return float(np.interp(total, xs, ys)) if xs[-1] > total else float(ys[-1])


def share_to_reach(points: list, target: float, total: float) -> float:
    """Rollout tokens at the first evaluation at or above target, as a share of `total`; inf where that
    is never, or only past `total` (the step that crossed the budget)."""
    t = tokens_to_reach(points, target)
    return float("inf") if t is None or t > total * (1 + 1e-9) else t / total


def run(args: argparse.Namespace, out: Path) -> None:
    # uniform runs first: its tokens are the others' budget, unless --tokens gives one
    strategies = list(args.strategies) if args.tokens else ["uniform"] + [s for s in args.strategies if s != "uniform"]
    for seed in args.seeds:
        for text in strategies:
            name, over = parse_strategy(text)
            run_name = f"{label(text)}-seed{seed}"
            done = out / run_name / "curve.json"
            if done.exists():
                print(f"{run_name}: done already", flush=True)
                continue
            if args.tokens:
                stop = [f"train.max_rollout_tokens={args.tokens}", f"eval.every_n_steps={args.eval_every}"]
            elif text == "uniform":
                stop = [f"train.max_steps={args.uniform_steps}", f"eval.every_n_steps={args.uniform_eval_every}"]
            else:
                budget = json.loads((out / f"uniform-seed{seed}" / "curve.json").read_text())["points"][-1][0]
                stop = [f"train.max_rollout_tokens={int(budget)}", f"eval.every_n_steps={args.eval_every}"]
            if text != "uniform" or args.tokens:
                stop.insert(0, "train.max_steps=1000")  # the token budget stops these runs
            cfg = load_config(None, [
                f"planner.strategy={name}", *[f"planner.{k}={v}" for k, v in over.items()],
                f"run.seed={seed}", *stop, f"data.eval_size={args.eval_size}",
                f"data.train_size={args.train_size}", "run.save_every=0", f"run.output_dir={out}",
                f"run.name={run_name}", "run.progress=false",
                *([f"run.torch_threads={args.threads}"] if args.threads else []),
                *[o.replace("{seed}", str(seed)) for o in args.overrides],
            ])
            train(cfg, quiet=True)
            c = curve(out / run_name)
            c.update(strategy=text, seed=seed)
            done.write_text(json.dumps(c))
            if args.drop_checkpoints:  # the curve is all the table needs; a final checkpoint is 1.6 GB
                shutil.rmtree(out / run_name / "checkpoints", ignore_errors=True)
            print(json.dumps(c), flush=True)


def mean_se(xs: list[float]) -> tuple[float, float]:
    """The mean of xs and its standard error over them (nan for a single value)."""
    return statistics.mean(xs), statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")


def paired_summary(uni: dict[int, dict], seeds: dict[int, dict]) -> str | None:
    """'| strategy | n | at uniform's tokens - uniform's final (SE) | ahead on | share median | share <= 0.5 on | mean-curve share |'
    cells."""
    both = sorted(s for s in seeds if s in uni)
    if not both:
        return None
    # at uniform's tokens: a budgeted run's last evaluation comes after the step that crossed them
    diff = [at_tokens(seeds[s]["points"], uni[s]["points"][-1][0]) - uni[s]["points"][-1][1] for s in both]
    mean_diff, se = mean_se(diff)
    shares = [share_to_reach(seeds[s]["points"], uni[s]["points"][-1][1], uni[s]["points"][-1][0]) for s in both]
    med = statistics.median(shares)
    mc, lo, hi, n = mean_curve_share(uni, seeds)
    return (f"{len(both)} | {mean_diff * 100:+.1f} ({se * 100:.1f}) | {sum(d > 0 for d in diff)} of {len(both)} "
            f"| {'never' if med == float('inf') else f'{med:.2f}'} | {sum(x <= 0.5 for x in shares)} of {len(both)} "
            f"| {fmt_interval(mc, lo, hi, n)} |")


def fmt_interval(x: float, lo: float, hi: float, n: int) -> str:
    """A share with its 95% interval; with fewer than 3 seeds no interval, and the seeds it rests on."""
    return f"{fmt_share(x)} [{fmt_share(lo)}, {fmt_share(hi)}]" if n >= 3 else f"{fmt_share(x)} (n={n})"


def uniform_gain(uni: dict[int, dict]) -> tuple[float, float]:
    """Uniform's mean gain, final minus start accuracy, over its seeds, with its SE (nan for one seed)."""
    return mean_se([r["points"][-1][1] - r["points"][0][1] for r in uni.values()])


def against_best(uni: dict[int, dict], by: dict[str, dict[int, dict]]) -> list[str]:
    """Uniform's gain over its start, and each strategy's mean-curve share against the highest point
    of uniform's mean curve rather than its last: the sturdier bar when uniform falls back late."""
    gain, se = uniform_gain(uni)
    m = mean_curve(uni, uni, sorted(uni))
    rows = [f"Uniform's gain over its start: {gain * 100:+.1f} points (SE {se * 100:.1f}) over {len(uni)} seeds; "
            f"its mean curve peaks at {m.max():.1%} (share {GRID[int(m.argmax())]:.2f}), ends at {m[-1]:.1%}.", "",
            "| strategy | share to uniform's mean-curve peak [95% CI] |", "|---|---|"]
    for strategy, seeds in by.items():
        if strategy != "uniform" and any(s in uni for s in seeds):
            mc, lo, hi, n = mean_curve_share(uni, seeds, target="best")
            rows.append(f"| {strategy} | {fmt_interval(mc, lo, hi, n)} |")
    return rows


def per_seed_table(uni: dict[int, dict], by: dict[str, dict[int, dict]]) -> list[str]:
    """One row per seed: uniform's final accuracy and tokens, then each strategy's accuracy at uniform's
    tokens and its share of them to reach uniform's final accuracy."""
    others = [s for s in by if s != "uniform"]
    head = ("| seed | uniform final (its tokens) | "
            + " | ".join(f"{s} at uniform's tokens | share" for s in others) + " |")
    rows = [head, "|---|---|" + "---|---|" * len(others)]
    for seed in sorted(uni):
        target, total = uni[seed]["points"][-1][1], uni[seed]["points"][-1][0]
        cells = [f"{seed}", f"{target:.1%} ({total:,.0f})"]
        for s in others:
            r = by[s].get(seed)
            cells += ["-", "-"] if r is None else [f"{at_tokens(r['points'], total):.1%}",
                                                   fmt_share(share_to_reach(r["points"], target, total))]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def report(out: Path, seeds: list[int] | None = None, strategies: list[str] | None = None,
           also: list[Path] | None = None, versus: list[str] | None = None) -> int:
    suffix = "" if seeds is None and strategies is None else "-selection"  # a subset never overwrites the full report
    missing = [str(d) for d in also or [] if not d.is_dir()]
    if missing:
        print(f"--also: no such folder: {', '.join(missing)}")
        return 2
    files = [p for d in [out, *(also or [])] for p in sorted(d.glob("*/curve.json"))]
    loaded = [(p.parent, json.loads(p.read_text())) for p in files]
    loaded = [(d, r) for d, r in loaded if (seeds is None or r["seed"] in seeds)
              and (strategies is None or r["strategy"] in strategies)]
    if not loaded:
        print(f"no finished runs under {', '.join(str(d) for d in [out, *(also or [])])}"
              + (f" of strategies {' '.join(strategies)}" if strategies else "") + (f" for seeds {seeds}" if seeds else ""))
        return 1
    absent = [s for s in strategies or [] if not any(r["strategy"] == s for _, r in loaded)]
    if absent:
        print(f"Warning: no finished runs of {', '.join(absent)} in these folders; left out of the tables\n")
    for d, r in loaded:  # curves saved before answer lengths were: read them from the run's metrics
        if r.get("answer_length") is None and (d / "metrics.jsonl").exists():
            r["answer_length"] = curve(d)["answer_length"]
    runs = [r for _, r in loaded]
    differ = compare_environments({d.name: load_environment(d) for d, _ in loaded})
    if differ:  # runs computed on different CPUs, thread counts or libraries do not pair seed by seed
        print("Warning: these runs were not all computed in the same environment:\n  " + "\n  ".join(differ) + "\n")
    by: dict[str, dict[int, dict]] = {}
    order = {s: i for i, s in enumerate(DEFAULT)}
    for r in sorted(runs, key=lambda r: (order.get(r["strategy"], len(order)), r["strategy"], r["seed"])):
        by.setdefault(r["strategy"], {})[r["seed"]] = r
    uni = by.get("uniform", {})
    if not uni:
        print("Warning: no uniform runs here: the shares and paired columns compare with uniform's runs of the same "
              "seeds, so they stay empty (add uniform to --strategies, or its folder with --also)\n")
    flat = [f"seed {seed}: uniform {r['points'][0][1]:.1%} at the start, {r['points'][-1][1]:.1%} at the end"
            for seed, r in sorted(uni.items()) if r["points"][-1][1] <= r["points"][0][1]]
    if flat:  # then every strategy "reaches uniform's final accuracy" at 0 tokens: the share says nothing
        print("Warning: uniform did not gain on these seeds, so reaching its final accuracy is no test there "
              "(every run starts at or above it; shares of 0.00):\n  " + "\n  ".join(flat) + "\n")
    lines = ["| strategy | seeds | accuracy at 0 | final accuracy (mean) | at uniform's tokens (mean) "
             "| tokens spent (mean) | steps (mean) | "
             "effective ratio | held-out answer tokens, start -> end | tokens to uniform's final (per seed) "
             "| share of uniform's tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for strategy, seeds in by.items():
        per_seed, shares, at_uni = [], [], []
        for seed, r in sorted(seeds.items()):
            if seed not in uni:
                continue
            target, total = uni[seed]["points"][-1][1], uni[seed]["points"][-1][0]
            at_uni.append(at_tokens(r["points"], total))
            x = share_to_reach(r["points"], target, total)  # past uniform's tokens is not reaching it
            t = tokens_to_reach(r["points"], target)
            per_seed.append("never" if t is None else f"{t:,.0f}" + ("" if x <= 1 else " (past)"))
            if x <= 1:
                shares.append(x)
        ok = len(shares) == len(per_seed) and shares
        share = f"{statistics.mean(shares):.2f}" if ok else f"- ({len(shares)}/{len(per_seed)} reached)"
        mean = statistics.mean
        lens = [r["answer_length"] for r in seeds.values() if r.get("answer_length")]
        length = f"{mean(a for a, _ in lens):.1f} -> {mean(b for _, b in lens):.1f}" if lens else "-"
        lines.append(
            f"| {strategy} | {len(seeds)} | {mean(r['points'][0][1] for r in seeds.values()):.1%} "
            f"| {mean(r['points'][-1][1] for r in seeds.values()):.1%} "
            f"| {f'{mean(at_uni):.1%}' if at_uni else '-'} "
            f"| {mean(r['points'][-1][0] for r in seeds.values()):,.0f} | {mean(r['steps'] for r in seeds.values()):.1f} "
            f"| {mean(r['effective_ratio'] for r in seeds.values()):.2f} | {length} | {', '.join(per_seed) or '-'} "
            f"| {share} |")
    for base in ["uniform", *(versus or [])]:
        if base not in by:
            continue
        lines += ["", f"Paired with {base} on the same seed (points of accuracy; share of {base}'s tokens to reach "
                  "its final accuracy):", "",
                  f"| strategy | seeds | at {base}'s tokens - {base}'s final (SE) | ahead on | share, median | share <= 0.5 on "
                  "| share on the mean curve [95% CI] |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {strategy} | {row}" for strategy, seeds in by.items()
                  if strategy not in ("uniform", base) and (row := paired_summary(by[base], seeds))]
    if uni and len(by) > 1:
        lines += ["", *against_best(uni, by)]
    lines += ["", *per_seed_table(uni, by)]
    table = "\n".join(lines)
    print(table)
    (out / f"table{suffix}.md").write_text(table + "\n")
    (out / f"results{suffix}.json").write_text(json.dumps(by, indent=1))
    png = f"curves{suffix}.png"

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (strategy, seeds) in enumerate(by.items()):
        for j, (seed, r) in enumerate(sorted(seeds.items())):
            xs, ys = zip(*r["points"])
            ax.plot(xs, ys, marker="o", ls=["-", "--", ":"][j % 3], color=f"C{i}",
                    label=f"{strategy} (seed {seed})")
    ax.set_xlabel("rollout tokens generated")
    ax.set_ylabel("held-out greedy accuracy")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / png, dpi=110)
    plt.close(fig)
    print(f"curves: {out / png}")
    if uni:  # the mean curves the mean-curve share is read from
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (strategy, seeds) in enumerate(by.items()):
            both = sorted(s for s in seeds if s in uni)
            ax.plot(GRID, mean_curve(uni, seeds, both), color=f"C{i}", lw=2.2 if strategy == "uniform" else 1.4,
                    label=f"{strategy} ({len(both)} seeds)")
        ax.axhline(float(mean_curve(uni, uni, sorted(uni))[-1]), color="grey", ls=":", label="uniform's mean final")
        ax.set_xlabel("rollout tokens generated, as a share of the seed's uniform run")
        ax.set_ylabel("held-out greedy accuracy, mean over seeds")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        mean_png = f"mean-curves{suffix}.png"
        fig.savefig(out / mean_png, dpi=110)
        plt.close(fig)
        print(f"mean curves: {out / mean_png}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategies", nargs="+", default=None, help=f"default: {' '.join(DEFAULT)} (--report: all found)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 (--report: all found)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="a fixed rollout-token budget per run (default: what uniform generates in --uniform-steps)")
    ap.add_argument("--uniform-steps", type=int, default=12)
    ap.add_argument("--uniform-eval-every", type=int, default=6)
    ap.add_argument("--eval-every", type=int, default=3)
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--train-size", type=int, default=200,
                    help="prompt pool; small enough that prompts come back, so beliefs have history")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per process (default: all cores)")
    ap.add_argument("--drop-checkpoints", action="store_true", help="delete each run's checkpoints once it has finished")
    ap.add_argument("--report", action="store_true", help="only build the table and PNG from finished runs")
    ap.add_argument("--out", default="bench/out/planner")
    ap.add_argument("--versus", nargs="+", default=None,
                    help="--report: strategies to pair the others with as well, besides uniform")
    ap.add_argument("--also", nargs="+", type=Path, default=None,
                    help="--report: more output folders whose finished runs join the table (written under --out)")
    ap.add_argument("overrides", nargs="*", help="extra KEY=VALUE config overrides for every run; {seed} in one "
                    "becomes the run's seed (planner.prior_counts=bench/out/pool_rates/seed{seed}.jsonl)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        args.strategies, args.seeds = args.strategies or DEFAULT, args.seeds or [0, 1]
        run(args, out)
    return report(out, args.seeds, args.strategies, args.also, args.versus)


if __name__ == "__main__":
    sys.exit(main())
