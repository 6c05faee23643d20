"""`rollwise report RUN_A RUN_B ...`: runs side by side, held-out accuracy against rollout tokens.

The first run is the baseline: every other run is read as "how many rollout tokens did it need to
reach the baseline's final held-out accuracy", the measure the planner exists to lower."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rollwise.config import leaves
from rollwise.tracking import read_metrics
from rollwise.ui import run_config, stop_reason

# settings that name or place a run, not what it computed
_NAMING = {"run.name", "run.output_dir"}


def evaluations(hist: list[dict]) -> list[tuple[float, float, float | None]]:
    """(cumulative rollout tokens, held-out accuracy, mean held-out answer length or None) at each
    evaluation of a run's metrics history: an evaluation after step s sits at the tokens of steps 1..s."""
    tokens_at = {0: 0.0}
    for h in hist:
        if "rollout/tokens_total" in h:
            tokens_at[h["step"]] = h["rollout/tokens_total"]
    return [(tokens_at.get(h["step"], 0.0), h["eval/accuracy"], h.get("eval/response_len_mean"))
            for h in hist if "eval/accuracy" in h]


def curve(run_dir: Path, max_step: int | None = None) -> dict[str, Any]:
    """(cumulative rollout tokens, held-out accuracy) at each evaluation, and the run's totals."""
    hist = [h for h in read_metrics(run_dir) if max_step is None or h["step"] <= max_step]
    evals = evaluations(hist)
    eff = [h["planner/effective_ratio"] for h in hist if "planner/effective_ratio" in h]
    lengths = [n for _, _, n in evals if n is not None]
    steps = [h for h in hist if "rollout/tokens_total" in h]
    return {"points": [(t, a) for t, a, _ in evals], "steps": max([0, *(h["step"] for h in steps)]),
            "tokens": max([0.0, *(h["rollout/tokens_total"] for h in steps)]),
            "effective_ratio": statistics.mean(eff) if eff else None,
            "answer_length": [lengths[0], lengths[-1]] if lengths else None}


def tokens_to_reach(points: list, target: float) -> float | None:
    """Rollout tokens at the first evaluation at or above `target` (None: never reached)."""
    for tok, acc in points:
        if acc >= target - 1e-9:
            return tok
    return None


def _differing_keys(flat: list[dict[str, Any]], skip: set[str] = _NAMING) -> list[str]:
    """The dotted keys whose value is not the same in every one of the flattened configs."""
    return [k for k in dict.fromkeys(k for f in flat for k in f)
            if k not in skip and len({repr(f.get(k)) for f in flat}) > 1]


def differing_settings(configs: dict[str, dict[str, Any]]) -> list[str]:
    """'KEY: value | value ...' (in the runs' order) for each setting whose value differs between them."""
    flat = [leaves(c) for c in configs.values()]
    return [f"{k}: {' | '.join(str(f.get(k, '-')) for f in flat)}" for k in _differing_keys(flat)]


def unfinished(run_dir: Path) -> str | None:
    """"step S of N" (and whether its final evaluation is missing) for a run that did not finish, by the rule of
    the report's "stopped by" (killed, still running, or killed during its final evaluation); None for a finished
    run, or one whose config names no train.max_steps."""
    cfg, hist = run_config(run_dir), read_metrics(run_dir, warn=False)
    reason = stop_reason(cfg, hist, run_dir) or ""
    if not reason.startswith("not finished"):
        return None
    last = max([0, *(h["step"] for h in hist if "rollout/reward_mean" in h)])
    return (f"step {last} of {cfg['train']['max_steps']}"
            + (", its final evaluation missing" if "final evaluation" in reason else ""))


def reach_target(points: list[tuple[float, float]]) -> tuple[float | None, str]:
    """(the first run's final accuracy as the target to reach, or None and why it is none): a target only
    if that run evaluated after training and gained."""
    if not points:
        return None, ""
    if points[-1][0] == 0:
        return None, "has no evaluation after training"
    if len(points) < 2:  # evaluated after training only (eval.at_start=false): no start to gain from
        return None, "has no evaluation before training to measure its gain from"
    if points[-1][1] <= points[0][1]:
        return None, "ended at or below its first evaluation, so reaching it tests nothing"
    return points[-1][1], ""


def compare_table(run_dirs: list[Path]) -> list[str]:
    """A markdown table, one row per run, the first run the baseline (and, when the first run's final
    accuracy is no target to reach, a line after it saying why)."""
    curves = [curve(d) for d in run_dirs]
    base = curves[0]
    target, why = reach_target(base["points"])
    base_where = unfinished(run_dirs[0])
    if base_where and target is not None:  # its last evaluation is no final accuracy to reach
        target, why = None, f"did not finish ({base_where})"
    held_out = [held_out_items(d) for d in run_dirs]
    other_items = False
    rows = ["| run | planner | steps | held-out accuracy, first -> last | rollout tokens | tokens / first run's "
            "| tokens to the first run's final accuracy (share) | effective ratio |",
            "|---|---|---|---|---|---|---|---|"]
    for i, (d, c) in enumerate(zip(run_dirs, curves)):
        planner = (run_config(d).get("planner") or {}).get("strategy", "-")
        pts = c["points"]
        # one evaluation (eval.at_start=false): no gain measured, so none shown
        acc = ("no evaluation" if not pts else f"{pts[0][1]:.1%} (one evaluation)" if len(pts) == 1 else
               f"{pts[0][1]:.1%} -> {pts[-1][1]:.1%} ({(pts[-1][1] - pts[0][1]) * 100:+.1f})")
        share = f"{c['tokens'] / base['tokens']:.2f}" if base["tokens"] else "-"
        reach = tokens_to_reach(pts, target) if target is not None else None
        reached = "-" if target is None or not pts else "never" if reach is None else (
            f"{reach:,.0f} ({reach / base['tokens']:.2f})" if base["tokens"] else f"{reach:,.0f}")
        if target is not None and pts and held_out[i] != held_out[0]:
            reached, other_items = "- (other held-out items)", True
        eff = "-" if c["effective_ratio"] is None else f"{c['effective_ratio']:.2f}"
        rows.append(f"| {d} | {planner} | {c['steps']} | {acc} | {c['tokens']:,.0f} | {share} | {reached} | {eff} |")
    if why:
        rows.append(f"(no tokens-to-reach: the first run, {run_dirs[0]}, {why})")
    for d in run_dirs:  # its last evaluation is no final accuracy, and its tokens no run's cost
        where = unfinished(d)
        if where:
            rows.append(f"(not finished: {d}, {where}; its last evaluation is not its final accuracy)")
    if other_items:
        rows.append("(other held-out items: a run whose data.* or run.seed differs from the first run's was scored on "
                    "other items, so the first run's accuracy is no target for it; runs over several seeds are paired "
                    "by seed below)")
    return rows


def held_out_items(run_dir: Path) -> tuple:
    """What decides a run's held-out items: its data settings and run.seed, not data.train_size (held-out
    items are drawn first, a generator's and a file's alike, whatever the training size)."""
    flat = leaves(run_config(run_dir))
    return tuple(sorted((k, repr(v)) for k, v in flat.items() if (k.startswith("data.") or k == "run.seed")
                        and k != "data.train_size"))


def paired_by_seed(run_dirs: list[Path]) -> list[str]:
    """Where the runs span several `run.seed`s: each group of runs (by the settings that differ, seed
    aside) against the first run's group on the seeds both have, paired by seed (final held-out
    accuracy, share of rollout tokens). Empty when there is nothing to pair."""
    configs = [leaves(run_config(d)) for d in run_dirs]
    seeds = [c.get("run.seed") for c in configs]
    keys = _differing_keys(configs, _NAMING | {"run.seed"})
    if len(set(seeds)) < 2 or not keys:
        return []
    by: dict[str, dict[Any, dict[str, Any]]] = {}
    twice: dict[str, set[Any]] = {}
    unevaluated: list[str] = []
    for d, c, seed in zip(run_dirs, configs, seeds):
        run = curve(d)
        if run["points"] and run["tokens"] and run["points"][-1][0] == 0:
            # evaluated before training only (killed before its final evaluation, or eval.at_end=false): its
            # last evaluation is its start, no final accuracy
            unevaluated.append(f"  {d}: no evaluation after training; not paired")
            continue
        where = unfinished(d)
        if where:  # killed after an evaluation during training: that is no final accuracy (nor its tokens a cost)
            unevaluated.append(f"  {d}: not finished ({where}); not paired")
            continue
        if not run["points"]:
            unevaluated.append(f"  {d}: no evaluation; not paired")
        elif run["tokens"]:
            group = ", ".join(f"{k}={c.get(k)}" for k in keys)
            if seed in by.setdefault(group, {}):
                twice.setdefault(group, set()).add(seed)
            by[group][seed] = run
    base = ", ".join(f"{k}={configs[0].get(k)}" for k in keys)
    lines = []
    for group, seen in twice.items():
        lines.append(f"  {group}: run.seed {', '.join(map(str, sorted(seen)))} in more than one run; this group is "
                     "not paired (give each seed once)")
    for group, runs in by.items():
        if group in twice or (group != base and base in twice):
            continue
        common = [s for s in runs if s in by.get(base, {})] if group != base else []
        if len(common) < 2:
            continue
        diffs = [100 * (runs[s]["points"][-1][1] - by[base][s]["points"][-1][1]) for s in common]
        ratios = [runs[s]["tokens"] / by[base][s]["tokens"] for s in common]
        se = statistics.stdev(diffs) / len(diffs) ** 0.5
        lines.append(f"  {group}: {statistics.mean(diffs):+.1f} points (SE {se:.1f}), ahead on "
                     f"{sum(d > 0 for d in diffs)} of {len(diffs)} seeds; {statistics.mean(ratios):.2f} of the tokens "
                     f"({min(ratios):.2f}-{max(ratios):.2f})")
    if not lines and unevaluated:  # the runs left out leave no pair: say which, not nothing
        return [f"not paired by run.seed with {base}: fewer than 2 seeds in common once these runs are left out:",
                *unevaluated]
    return [f"paired by run.seed with {base} (final held-out accuracy, rollout tokens):", *lines, *unevaluated] \
        if lines else []


def plot_comparison(run_dirs: list[Path], out: Path) -> Path:
    """Held-out accuracy against rollout tokens and against step, and rollout tokens against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for i, d in enumerate(run_dirs):
        hist = read_metrics(d, warn=False)
        evals = evaluations(hist)
        steps = [h for h in hist if "rollout/tokens_total" in h]
        style = {"color": f"C{i % 10}", "label": str(d), "marker": "o" if len(evals) < 30 else None}
        if evals:
            axes[0].plot([t for t, _, _ in evals], [a for _, a, _ in evals], **style)
            axes[1].plot([h["step"] for h in hist if "eval/accuracy" in h], [a for _, a, _ in evals], **style)
        axes[2].plot([h["step"] for h in steps], [h["rollout/tokens_total"] for h in steps],  # one step: a marker
                     color=style["color"], label=str(d), marker="o" if len(steps) < 30 else None)
    for ax, title, xlabel in zip(axes, ("held-out accuracy", "held-out accuracy", "rollout tokens (cumulative)"),
                                 ("rollout tokens (cumulative)", "step", "step")):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if xlabel == "step":  # no step 1.5 on runs of a few steps
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    if not any(ln.get_label() and not ln.get_label().startswith("_") for ln in axes[0].get_lines()):
        for ax in axes[:2]:  # no run evaluated: say so instead of empty axes
            ax.text(0.5, 0.5, "no evaluation in these runs", ha="center", va="center", transform=ax.transAxes)
    axes[2].legend(fontsize=7)  # every run has a line here, evaluated or not
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def report_runs(run_dirs: list[Path], out: Path) -> None:
    """Print the comparison (settings that differ, environments that differ, the table) and draw it."""
    from rollwise.environment import compare_environments, environment_entries
    from rollwise.ui import resumes

    for d in run_dirs:  # every folder checked before anything is printed
        read_metrics(d, warn=False)
    differ = differing_settings({str(d): run_config(d) for d in run_dirs})
    entries = {str(d): environment_entries(d) for d in run_dirs}
    changed = {d: resumes(e) for d, e in entries.items() if any(e_.get("config_changes") for e_ in e)}
    # config.yaml holds a run's settings as they ended: a resume's changes held only for its later steps
    print("settings that differ (in the order of the runs):" if differ else
          "the runs' settings are the same" + (" as they ended" if changed else ""))
    for line in differ:
        print(f"  {line}")
    if changed:
        print("settings changed by a resume (config.yaml holds the new values):")
        for d, line in changed.items():
            print(f"  {d}: resumed at {line}")
    # every segment of a run: a resume may run on another machine, dtype or library version
    segments: dict[str, dict[str, Any] | None] = {}
    for d, es in entries.items():
        for e in es or [None]:  # None: no environment.json (older runs)
            step = None if e is None else e.get("resumed_from_step")
            segments[d if step is None else f"{d} (resumed at step {step})"] = e
    envs = compare_environments(segments)
    if envs:  # a different CPU, dtype or library version changes a run's numbers as much as a setting
        print("computed in different environments:\n  " + "\n  ".join(envs))
    print()
    print("\n".join(compare_table(run_dirs)))
    paired = paired_by_seed(run_dirs)
    if paired:
        print("\n" + "\n".join(paired))
    print(f"\nplots: {plot_comparison(run_dirs, out)}")
