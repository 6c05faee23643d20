"""Summaries of simulated runs: per-strategy statistics with 95% Student-t intervals of the mean
over seeds, a rich table, a markdown table and the accuracy-vs-budget curves as a PNG."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rollwise.sim.runner import RunResult

GRID = 201
MIN_CI_SEEDS = 3  # fewer contributing seeds: the mean alone, marked (n=...)
# Student t's 0.975 quantiles for 1..30 degrees of freedom (to 9 digits; above 30 `t975` expands about 1.96)
T975 = (12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851, 2.364624252, 2.306004135,
        2.262157163, 2.228138852, 2.200985160, 2.178812830, 2.160368656, 2.144786688, 2.131449546, 2.119905299,
        2.109815578, 2.100922040, 2.093024054, 2.085963447, 2.079613845, 2.073873068, 2.068657610, 2.063898562,
        2.059538553, 2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456)


@dataclass
class Stat:
    mean: float
    lo: float
    hi: float
    n: int  # seeds that contributed (rollouts-to-target skips seeds that never reach it); -1: not defined

    def fmt(self, scale: float = 1.0, digits: int = 3) -> str:
        if self.n < 0:
            return "n/a"
        if self.n == 0 or not math.isfinite(self.mean):
            return "never"
        m, lo, hi = self.mean / scale, self.lo / scale, self.hi / scale
        if self.n < MIN_CI_SEEDS:  # over 2 values the 95% interval is the mean +- 6.4x their distance: no use
            return f"{m:.{digits}f} (n={self.n})"
        return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom: the table to 30, above it the
    Cornish-Fisher expansion in 1/df about the normal's 1.96 (within 1e-6 there)."""
    if df < 1:
        raise ValueError(f"t975: {df} degrees of freedom")
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959963984540054
    terms = ((z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96, (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
             (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
    return z + sum(g / df ** (k + 1) for k, g in enumerate(terms))


def mean_interval(x: np.ndarray, bounds: tuple[float, float] = (-math.inf, math.inf)) -> Stat:
    """Mean over seeds (NaNs dropped) and its 95% Student-t interval, mean +- t(0.975, n-1) s / sqrt(n),
    cut to `bounds` (a share's [0, 1]: the mean cannot lie outside). Over 3-5 seeds a percentile
    bootstrap of the mean, which this replaced, held the mean about 71-83% of the time instead of 95%
    (its spread is s * sqrt((n-1)/n) / sqrt(n) and it cuts at 1.96, not t); at 20 seeds this is about
    10% wider than it was."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return Stat(float("nan"), float("nan"), float("nan"), 0)
    if len(x) == 1 or np.ptp(x) == 0:  # all seeds equal: the interval is the point (no rounding noise)
        return Stat(float(x[0]), float(x[0]), float(x[0]), len(x))
    m = float(x.mean())
    half = t975(len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return Stat(m, max(m - half, min(bounds[0], m)), min(m + half, max(bounds[1], m)), len(x))


SHARE = (0.0, 1.0)
CI_TITLE = "95% t-interval of the mean over seeds"  # in the command's title; the PNG's says what its bands are


def spend(r: RunResult, unit: str) -> np.ndarray:
    return r.tokens if unit == "tokens" else r.rollouts


def curve(r: RunResult, unit: str) -> np.ndarray:
    """Held-out accuracy on a common grid of 0..total budget: at x, the accuracy after the last step
    whose rollouts (tokens) were all spent by x. A step's update needs all of them, so accuracy is
    not interpolated inside a step; the step that crosses the total gives no credit (DAPO's
    back-fill steps spend 3x a step's budget)."""
    x = np.linspace(0.0, r.budget_total, GRID)
    spent = spend(r, unit)
    idx = np.searchsorted(spent, x * (1 + 1e-9), side="right") - 1  # rounding at the total: that step counts
    return np.asarray(r.accuracy)[np.maximum(idx, 0)]


def area(r: RunResult, unit: str) -> float:
    """The mean held-out accuracy over 0..total budget: the exact area under the step function that `curve`
    samples (after each step, its accuracy until the next step's end), divided by the total. The step that
    crosses the total gives no credit; a run that stopped short of the total keeps its last accuracy."""
    total = float(r.budget_total)
    acc = np.asarray(r.accuracy, dtype=float)
    if total <= 0:
        return float(acc[0])
    start = np.minimum(np.asarray(spend(r, unit), dtype=float), total)
    width = np.append(start[1:], total) - start  # how long each accuracy held inside the budget
    return float(np.dot(acc, width) / total)


def first_reach(r: RunResult, unit: str, target: float) -> float:
    """Budget spent by the end of the first step after which held-out accuracy reaches `target`; NaN
    if no step within the run's budget reaches it."""
    x, acc = spend(r, unit), r.accuracy
    hit = np.flatnonzero(acc >= target)
    if len(hit) == 0:
        return float("nan")
    reach, total = float(x[int(hit[0])]), r.budget_total
    # uniform reaches its own final accuracy exactly at the budget: allow rounding there
    return min(reach, total) if reach <= total * (1 + 1e-9) else float("nan")


def summarize(results: dict[str, list[RunResult]], unit: str, target: float | None) -> dict[str, dict[str, Stat]]:
    """Per strategy: budget to reach the target, its share of the total budget, the decode-step
    latency until then as a share of uniform's whole run (same seed), final
    accuracy, area under the accuracy curve (normalised: the mean accuracy over the budget),
    effective ratio. With target None each seed's target is uniform's final accuracy in
    that seed (paired comparison)."""
    if target is None and "uniform" not in results:
        raise ValueError("pass --target, or include a plain 'uniform' row (no ':key=value') in --strategies: its final accuracy is the target")
    base = {r.seed: float(curve(r, unit)[-1]) for r in results.get("uniform", [])}
    # uniform's latency at the total budget: its last step can overshoot a token budget, and its
    # own "to target" is capped there
    base_latency = {r.seed: float(np.interp(r.budget_total, spend(r, unit), r.latency))
                    for r in results.get("uniform", []) if r.latency is not None}
    out: dict[str, dict[str, Stat]] = {}
    for name, runs in results.items():
        reach = np.array([first_reach(r, unit, target if target is not None else base[r.seed]) for r in runs])
        total = np.array([r.budget_total for r in runs])
        curves = np.array([curve(r, unit) for r in runs])
        latency = np.array([float(np.interp(x, spend(r, unit), r.latency)) / base_latency[r.seed]
                            if np.isfinite(x) and r.latency is not None and base_latency.get(r.seed) else float("nan")
                            for r, x in zip(runs, reach)])
        out[name] = {
            "reach": mean_interval(reach, (0.0, float(total.max()))),  # capped at the run's total, as its share at 1
            "reach_share": mean_interval(reach / total, SHARE),
            # a share of uniform's run: not defined without a uniform row (not "never"); above 1 when slower
            "latency_share": mean_interval(latency, (0.0, math.inf)) if base_latency else Stat(math.nan, math.nan, math.nan, -1),
            "final": mean_interval(curves[:, -1], SHARE),
            "auc": mean_interval(np.array([area(r, unit) for r in runs]), SHARE),  # exact, not the grid's mean
            "effective": mean_interval(np.array([r.effective / max(r.generated, 1) for r in runs]), SHARE),
            "effective_trained": mean_interval(np.array([r.effective / max(r.trained, 1) for r in runs]), SHARE),
            "all_wrong": mean_interval(np.array([r.all_wrong for r in runs]), SHARE),
            "all_correct": mean_interval(np.array([r.all_correct for r in runs]), SHARE),
        }
    return out


COLUMNS = [
    ("to target ({u}, k)", "reach", 1000.0, 1),
    ("share of budget", "reach_share", 1.0, 2),
    ("latency to target (share)", "latency_share", 1.0, 2),
    ("final held-out acc", "final", 1.0, 3),
    ("AUC (mean acc)", "auc", 1.0, 3),
    ("effective ratio", "effective", 1.0, 2),
    ("effective ratio of trained", "effective_trained", 1.0, 2),
    ("all-wrong share", "all_wrong", 1.0, 2),
]


def table_rows(summary: dict[str, dict[str, Stat]], seeds: int) -> list[list[str]]:
    rows = []
    for name, s in summary.items():
        row = [name]
        for _, key, scale, digits in COLUMNS:
            cell = s[key].fmt(scale, digits)
            row.append(cell + " *" if 0 < s[key].n < seeds else cell)  # averaged over fewer seeds than run
        row.append(f"{s['reach'].n}/{seeds}")
        rows.append(row)
    return rows


def headers(unit: str) -> list[str]:
    return ["strategy"] + [c[0].format(u=unit) for c in COLUMNS] + ["reached"]


def print_table(summary: dict[str, dict[str, Stat]], unit: str, seeds: int, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    rows = table_rows(summary, seeds)
    name_width = min(60, max(len(r[0]) for r in rows) if rows else 8)
    for i, h in enumerate(headers(unit)):
        t.add_column(h, justify="left" if i == 0 else "right", no_wrap=i > 0, overflow="fold",
                     min_width=name_width if i == 0 else None, max_width=60 if i == 0 else None)
    for row in rows:
        t.add_row(*row)
    # wide enough for every column on one line: a narrow terminal scrolls rather than hiding the names
    Console(width=max(name_width + 220, Console().width)).print(t)


def legend(unit: str) -> str:
    """What the table's columns mean, printed under it."""
    return (f"to target: {unit} (thousands) spent when held-out accuracy first reaches the target, mean over "
            "the seeds that reached it (see 'reached'); share of budget: the same as a share of the run's total; "
            "latency: decode steps until then as a share of uniform's whole run (same seed); effective ratio: "
            "share of generated rollouts in groups with a gradient (of trained samples: the issue's wording); "
            "*: a mean over fewer seeds than were run (the others never reached the target); (n=1), (n=2): a mean "
            f"over that many seeds, too few for an interval; n/a: needs a plain uniform row.")


def markdown_table(summary: dict[str, dict[str, Stat]], unit: str, seeds: int) -> str:
    hs = headers(unit)
    lines = ["| " + " | ".join(hs) + " |", "|" + "|".join("---" for _ in hs) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(summary, seeds)]
    return "\n".join(lines) + "\n"


def plot_curves(results: dict[str, list[RunResult]], unit: str, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, runs in results.items():
        total = runs[0].budget_total
        x = np.linspace(0, total, GRID)
        c = np.array([curve(r, unit) for r in runs])
        m = c.mean(axis=0)
        # the table's rule: mean +- t(0.975, n-1) SE, no band below MIN_CI_SEEDS seeds
        n = len(runs)
        half = t975(n - 1) * c.std(axis=0, ddof=1) / math.sqrt(n) if n >= MIN_CI_SEEDS else np.zeros_like(m)
        top = name == "uniform"  # drawn over the rest: rows equal to it would hide it otherwise
        line, = ax.plot(x, m, label=name, lw=2.2 if top else 1.4, zorder=3 if top else 2,
                        color="black" if top else None)
        ax.fill_between(x, np.maximum(m - half, 0.0), np.minimum(m + half, 1.0), alpha=0.15, color=line.get_color(),
                        zorder=1)
    title = title.replace(CI_TITLE, f"bands: 95% t-interval of the mean over seeds (unpaired; none under {MIN_CI_SEEDS} seeds)")
    ax.set_xlabel(f"cumulative {unit} generated (discarded included)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("\n".join(textwrap.wrap(title, 100)), fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
