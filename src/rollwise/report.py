"""`rollwise report RUN_DIR`: plots of what happened, and the summary table."""

from __future__ import annotations

from pathlib import Path

from rollwise.tracking import read_metrics


def panels_of(hist: list[dict]) -> list[tuple[str, str, list]]:
    """(title, kind, data) per panel: kind "line" (data: [(label, [(step, value)])]), or "hist"
    (data: the per-prompt sample counts of every step)."""
    steps = [h for h in hist if "rollout/reward_mean" in h]
    evals = [h for h in hist if "eval/accuracy" in h]

    def series(key: str) -> list[tuple[float, float]]:
        return [(h["step"], h[key]) for h in steps if key in h]

    out: list[tuple[str, str, list]] = [
        ("training reward", "line", [("", series("rollout/reward_mean"))]),
        ("held-out accuracy", "line", held_out(evals)),
        ("rollout tokens (cumulative)", "line", [("", series("rollout/tokens_total"))]),
    ]
    for key, title in (("eval/response_len_mean", "held-out answer length (tokens)"),
                       ("eval/truncated_frac", "held-out answers cut at the length cap")):
        if any(key in h for h in evals):
            out.append((title, "line", [("", [(h["step"], h[key]) for h in evals if key in h])]))
    for title, keys in (("rollouts per step", (("generated (discarded included)", "rollout/rollouts"),
                                               ("discarded", "rollout/discarded_rollouts"),
                                               ("top-ups the budget refused", "planner/refused_rollouts"))),
                        ("rollout tokens per step", (("generated (discarded included)", "rollout/tokens"),
                                                     ("discarded", "rollout/discarded_tokens"))),
                        ("effective ratio", (("of rollouts generated", "planner/effective_ratio"),
                                              ("of samples trained", "planner/effective_ratio_trained"))),
                        ("groups with equal rewards (rollout/frac_zero_std_groups)",
                         (("", "rollout/frac_zero_std_groups"),)),
                        ("estimator's Brier score", (("every prompt rolled out", "planner/brier"),
                                                     ("prompts seen before", "planner/brier_seen"),
                                                     ("bias (predicted - observed)", "planner/prediction_bias")))):
        lines = [(label, series(key)) for label, key in keys if any(key in h for h in steps)]
        if lines:
            out.append((title, "line", lines))
    if any("planner/all_wrong_share" in h for h in steps):
        # by successes (reward >= planner.success_threshold): with partial credit a group can be all
        # "wrong" with unequal rewards; rollout/frac_zero_std_groups is the equal-reward share
        out.append(("groups with no success / all successes", "line",
                    [("no success", series("planner/all_wrong_share")),
                     ("all successes", series("planner/all_correct_share"))]))
    if any("planner/revisit_share" in h for h in steps):
        out.append(("gradient groups on prompts trained before", "line",
                    [("", series("planner/revisit_share"))]))
    if any("planner/prompts_trained" in h for h in steps):
        out.append(("prompts trained with a gradient (cumulative)", "line", [("", series("planner/prompts_trained"))]))
    counts = [n for h in steps for n in h.get("planner/samples_per_prompt", [])]
    if counts:
        out.append(("samples per prompt (every step)", "hist", counts))
    tasks = sorted({k for h in steps for k in h if k.startswith("planner/task_share/")})
    if tasks:  # a task given no rollout in a step is not logged there: its share is 0, not a line across the step
        shared = [h for h in steps if any(k in h for k in tasks)]
        out.append(("share of rollouts per task", "line",
                    [(k.rsplit("/", 1)[1], [(h["step"], h.get(k, 0.0)) for h in shared]) for k in tasks]))
    right, wrong = length_by_outcome(steps)
    if right:
        out.append(("response tokens in groups with both outcomes", "line", [("correct", right), ("wrong", wrong)]))
    unseen = unseen_solve_rate(steps)
    if unseen:
        out.append(("solve rate on prompts never rolled out before (blocks of 5 steps)", "line", [("", unseen)]))
    return out


def held_out(evals: list[dict]) -> list:
    """The held-out accuracy panel's lines: the accuracy, and the best so far when the run logs it."""
    acc = [(h["step"], h["eval/accuracy"]) for h in evals]
    best = [(h["step"], h["eval/best_accuracy"]) for h in evals if "eval/best_accuracy" in h]
    return [("accuracy", acc), ("best so far", best)] if best else [("", acc)]


def lengths_by_outcome(group: list) -> tuple[list[int], list[int]] | None:
    """(correct, wrong) response lengths of one `rollout/groups` entry that has both outcomes and
    logs lengths (runs since 2026-12-04); None for any other group."""
    if len(group) < 3 or "0" not in group[1] or "1" not in group[1]:
        return None
    ok = [n for o, n in zip(group[1], group[2]) if o == "1"]
    return ok, [n for o, n in zip(group[1], group[2]) if o == "0"]


def length_by_outcome(steps: list[dict]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """Per step, the mean response tokens of correct and of wrong responses in groups with both
    (the groups GRPO learns from), from `rollout/groups` of runs that log lengths: when correct
    answers are the shorter ones, training pushes answers shorter."""
    right, wrong = [], []
    for h in sorted(steps, key=lambda h: h["step"]):
        ok, bad = [], []
        for g in h.get("rollout/groups", []):
            split = lengths_by_outcome(g)
            if split:
                ok += split[0]
                bad += split[1]
        if ok and bad:
            right.append((h["step"], sum(ok) / len(ok)))
            wrong.append((h["step"], sum(bad) / len(bad)))
    return right, wrong


def unseen_solve_rate(steps: list[dict], block: int = 5) -> list[tuple[float, float]]:
    """(last step of the block, share correct) of the first sample of each prompt's first group, in
    blocks of `block` steps, from `rollout/groups`. No planner chooses a prompt it has never seen by
    its outcome, and a first sample is drawn whatever it shows, so this follows the policy's solve
    rate at the sampling temperature the same way whatever the strategy (rollout accuracy does not:
    it is over the samples the planner chose to train on). Groups are logged in the order requested
    (runs before 2026-12-07 logged a round in the order it finished: there the first is the shortest)."""
    seen: set[str] = set()
    firsts: list[tuple[int, int]] = []  # (step, correct)
    for h in sorted(steps, key=lambda h: h["step"]):
        for uid, outcomes, *_ in h.get("rollout/groups", []):  # lengths third since 2026-12-04
            if uid not in seen and outcomes:
                seen.add(uid)
                firsts.append((h["step"], int(outcomes[0] == "1")))
    if not firsts:
        return []
    out = []
    last = max(s for s, _ in firsts)
    for end in range(block, last + block, block):
        xs = [c for s, c in firsts if end - block < s <= end]
        if xs:
            out.append((float(min(end, last)), sum(xs) / len(xs)))
    return out


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Draw the run's panels into `out` (default RUN_DIR/report.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = panels_of(read_metrics(run_dir))
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (title, kind, data) in zip(axes.flat, panels):
        if kind == "hist":  # one bar per count, centred on it
            ax.hist(data, bins=[b - 0.5 for b in range(0, max(data) + 2)], color="C0")
            ax.set_xlabel("samples")
        else:
            for label, pts in data:
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, label=label or None)
            if any(label for label, pts in data if pts):
                ax.legend(fontsize=7)
            if not any(pts for _, pts in data):  # for example held-out accuracy in a run that never evaluated
                ax.text(0.5, 0.5, "not logged in this run", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # no step (or count) 1.5
        ax.set_title(title)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out) if out else Path(run_dir) / "report.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
