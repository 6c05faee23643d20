"""Planner strategies in real training: held-out accuracy against rollout tokens.

    .venv/bin/python bench/planner.py --strategies uniform dapo mopps greso --seeds 0 1 --tokens 30000

Each strategy trains SmolLM2-135M-Instruct on the default task mixture until it has generated
`--tokens` response tokens (the same rollout-token budget for all), evaluating greedy held-out
accuracy every `--eval-every` steps. Prints a table (final accuracy, tokens to reach uniform's
final accuracy) and writes bench/out/planner/{results.json,curves.png}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from rollwise.config import load_config
from rollwise.loop import train
from rollwise.tracking import read_metrics


def curve(run_dir: Path) -> list[tuple[float, float]]:
    """(cumulative rollout tokens, held-out accuracy) at each evaluation."""
    hist = read_metrics(run_dir)
    tokens_at = {0: 0.0}
    for h in hist:
        if "rollout/tokens_total" in h:
            tokens_at[h["step"]] = h["rollout/tokens_total"]
    return [(tokens_at.get(h["step"], 0.0), h["eval/accuracy"]) for h in hist if "eval/accuracy" in h]


def tokens_to_reach(c: list[tuple[float, float]], target: float) -> float | None:
    for tok, acc in c:
        if acc >= target:
            return tok
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strategies", nargs="+", default=["uniform", "dapo", "mopps", "greso"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--tokens", type=int, default=30000, help="rollout-token budget per run")
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--out", default="bench/out/planner")
    ap.add_argument("overrides", nargs="*", help="extra KEY=VALUE config overrides for every run")
    args = ap.parse_args()
    out = Path(args.out)
    results: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for strategy in args.strategies:
        for seed in args.seeds:
            name = f"{strategy}-seed{seed}"
            cfg = load_config(None, [
                f"planner.strategy={strategy}", f"run.seed={seed}", "train.max_steps=1000",
                f"train.max_rollout_tokens={args.tokens}", f"eval.every_n_steps={args.eval_every}",
                f"data.eval_size={args.eval_size}", "run.save_every=0", f"run.output_dir={out}", f"run.name={name}",
                "run.progress=false", *args.overrides,
            ])
            train(cfg, quiet=True)
            results.setdefault(strategy, {})[seed] = curve(out / name)
            print(json.dumps({"run": name, "curve": results[strategy][seed]}), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))

    print(f"\n{'strategy':<10} {'final acc (mean of seeds)':>26} {'tokens to uniform final':>25} {'share':>7}")
    uni = results.get("uniform", {})
    for strategy, runs in results.items():
        finals = [c[-1][1] for c in runs.values()]
        reach = []
        for seed, c in runs.items():
            if seed in uni:
                t = tokens_to_reach(c, uni[seed][-1][1])
                reach.append(t if t is not None else float("nan"))
        total = [c[-1][0] for c in uni.values()]
        share = statistics.mean(reach) / statistics.mean(total) if reach and total else float("nan")
        print(f"{strategy:<10} {statistics.mean(finals):>26.3f} {statistics.mean(reach) if reach else float('nan'):>25.0f}"
              f" {share:>7.2f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for strategy, runs in results.items():
        for i, c in enumerate(runs.values()):
            xs, ys = zip(*c)
            ax.plot(xs, ys, marker="o", color=f"C{list(results).index(strategy)}", label=strategy if i == 0 else None)
    ax.set_xlabel("rollout tokens")
    ax.set_ylabel("held-out greedy accuracy")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
