"""`rollwise report RUN_DIR`: plots of what happened, and the summary table."""

from __future__ import annotations

from pathlib import Path

from rollwise.tracking import read_metrics


def plot_run(run_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = read_metrics(run_dir)
    steps = [h for h in hist if "rollout/reward_mean" in h]
    evals = [h for h in hist if "eval/accuracy" in h]
    panels = [
        ("training reward", [(h["step"], h["rollout/reward_mean"]) for h in steps]),
        ("held-out accuracy", [(h["step"], h["eval/accuracy"]) for h in evals]),
        ("rollout tokens (cumulative)", [(h["step"], h.get("rollout/tokens_total", 0)) for h in steps]),
    ]
    extra = [k for k in ("planner/effective_ratio", "rollout/frac_zero_std_groups", "planner/brier") if any(k in h for h in steps)]
    for k in extra:
        panels.append((k, [(h["step"], h[k]) for h in steps if k in h]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for ax, (title, pts) in zip(axes, panels):
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if len(pts) < 30 else None)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(run_dir) / "report.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
