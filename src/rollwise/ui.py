"""What the terminal shows: a progress bar with reward, accuracy and tokens/s, and a summary."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

console = Console(stderr=True)
active_run_dir: Path | None = None  # the folder of the run this process trains, once made (the Ctrl-C message)


class StepProgress:
    """A progress bar on a terminal; where stderr is a file (nohup, a cluster's job log), which a bar does not
    redraw to, a plain line every LOG_EVERY_S seconds and at the last step instead."""

    LOG_EVERY_S = 30.0
    clock = staticmethod(time.monotonic)

    def __init__(self, total: int, start: int, enabled: bool = True):
        self.enabled = enabled
        self.total = total
        self.plain = enabled and not console.is_terminal
        self.t0 = self.last_line = self.clock()
        self.start = start
        self.progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=console, disable=not enabled or self.plain,  # a log file gets plain lines instead
        )
        self.task = self.progress.add_task("train", total=total, completed=start, info="")
        self.step, self.info, self.shown = start, "", start  # the last step updated, its figures, the last step written
        if enabled:
            self.progress.start()

    def update(self, step: int, m: dict[str, Any]) -> None:
        info = (f"reward {m.get('rollout/reward_mean', 0):.3f}  acc {m.get('rollout/accuracy', 0):.2f}  "
                f"{m.get('rollout/tokens_per_s', 0):.0f} tok/s")
        if "eval/accuracy" in m:
            info += f"  eval {m['eval/accuracy']:.3f}"
        self.progress.update(self.task, completed=step, info=info)
        self.step, self.info = step, info
        now = self.clock()
        if self.plain and (now - self.last_line >= self.LOG_EVERY_S or step >= self.total):
            self._line(now)

    def _line(self, now: float, stopped: bool = False) -> None:
        self.last_line, self.shown = now, self.step
        per_step = (now - self.t0) / max(self.step - self.start, 1)
        left = "stopped" if stopped else f"about {per_step * (self.total - self.step):.0f} s left"
        print(f"rollwise: step {self.step}/{self.total}  {self.info}  {now - self.t0:.0f} s, {left}", file=sys.stderr,
              flush=True)

    def note(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(text, style="yellow", markup=False)
        else:  # the bar is off (run.progress=false): a warning is still said
            print(f"rollwise: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.plain and self.step > self.shown:  # stopped before train.max_steps (a token budget, early stopping)
            self._line(self.clock(), stopped=True)
        if self.enabled:
            self.progress.stop()


def summarize(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The numbers a user wants at the end of a run, from its metrics.jsonl lines."""
    steps = [h for h in history if "rollout/reward_mean" in h]
    evals = [h for h in history if "eval/accuracy" in h]
    out: dict[str, Any] = {"steps": max((h["step"] for h in steps), default=0)}
    if evals:
        out["eval accuracy (first)"] = f"{evals[0]['eval/accuracy']:.3f} @ step {evals[0]['step']}"
        out["eval accuracy (last)"] = f"{evals[-1]['eval/accuracy']:.3f} @ step {evals[-1]['step']}"
        best = max(evals, key=lambda h: h["eval/accuracy"])  # the first of equals
        out["eval accuracy (best)"] = f"{best['eval/accuracy']:.3f} @ step {best['step']}"
        for k in evals[-1]:
            if k.startswith("eval/pass@"):
                out[k] = f"{evals[-1][k]:.3f}"
    if steps:
        k = max(1, len(steps) // 4)
        out["train reward (first quarter)"] = f"{sum(h['rollout/reward_mean'] for h in steps[:k]) / k:.3f}"
        out["train reward (last quarter)"] = f"{sum(h['rollout/reward_mean'] for h in steps[-k:]) / k:.3f}"
        for label, key in (("rollouts generated", "rollout/rollouts_total"), ("rollout tokens", "rollout/tokens_total")):
            out[label] = int(next((h[key] for h in reversed(steps) if key in h), 0))  # the last total logged
        eff = [h["planner/effective_ratio"] for h in steps if "planner/effective_ratio" in h]
        if eff:  # the mean over steps of each step's share of its rollouts in trained groups whose rewards differ
            out["effective ratio (mean)"] = f"{sum(eff) / len(eff):.2f}"
        timed = [h for h in steps if "time/step_s" in h and "time/generate_s" in h]
        if timed:
            out["median step time (s)"] = f"{statistics.median(h['time/step_s'] for h in timed):.1f}"
            tot = sum(h["time/step_s"] for h in timed)
            out["generation share of step time"] = f"{sum(h['time/generate_s'] for h in timed) / tot:.0%}" if tot else "-"
        out["skipped zero-advantage samples"] = f"{sum(h.get('train/skipped_zero_adv', 0) for h in steps):.0f}"
        errs = sum(h.get("reward/errors", 0) + h.get("reward/timeouts", 0) + h.get("reward/nans", 0) for h in steps)
        out["reward failures (scored 0)"] = int(errs)
    return out


_UNREADABLE_SAID: set[str] = set()


def run_config(run_dir: Path) -> dict[str, Any]:
    """The run's config.yaml as written ({} when the file is missing or unreadable; an unreadable one is
    said once on stderr, since the report then knows neither the settings nor what stopped the run)."""
    path = Path(run_dir) / "config.yaml"
    try:
        cfg = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as e:
        cfg, why = None, str(e).splitlines()[0]
    else:
        why = "it is empty" if cfg is None else f"it holds a {type(cfg).__name__}, not settings"
    if isinstance(cfg, dict):
        return cfg
    if str(path) not in _UNREADABLE_SAID:
        _UNREADABLE_SAID.add(str(path))
        print(f"rollwise: warning: {path} is unreadable ({why}); its settings, and what stopped the run, are not "
              "shown", file=sys.stderr)
    return {}


def start_again_command(run_dir: Path | str) -> str:
    """The command that starts a run with no checkpoint again in its own folder (its metrics are replaced)."""
    run_dir = Path(run_dir)
    return f"`rollwise train {run_dir / 'config.yaml'} run.name={run_dir.name} run.output_dir={run_dir.parent}`"


def checkpointed_step(run_dir: Path | str) -> int | None:
    """The step of the run's last checkpoint (checkpoints/step_N), None when it has none (as
    training.checkpoint.latest_checkpoint finds it, without importing torch)."""
    steps = [int(p.name[5:]) for p in (Path(run_dir) / "checkpoints").glob("step_*") if p.name[5:].isdigit()]
    return max(steps, default=None)


def final_eval_missing(cfg: dict[str, Any], history: list[dict[str, Any]], last: int) -> bool:
    """The run's config has eval.at_end on (and held-out items) but metrics.jsonl holds no evaluation of
    its last step `last`: the rule of loop.final_eval_due, so a resume makes that evaluation. A stop by
    early stopping has evaluated its last step already."""
    ev, data = cfg.get("eval") or {}, cfg.get("data") or {}
    if ev.get("at_end") is not True or last == 0 or not (data.get("eval_size", 300) or 0) > 0:
        return False
    held_out = [h["data/eval_items"] for h in history if "data/eval_items" in h]  # runs since 2026-12-07
    if held_out and held_out[-1] == 0:  # a file too small to hold any out, or every item over the prompt limit
        return False
    return not any(h.get("step") == last and "eval/accuracy" in h for h in history)


def stop_reason(cfg: dict[str, Any], history: list[dict[str, Any]], run_dir: Path | str = "RUN_DIR") -> str | None:
    """Why the run's last step is its last, from its config and metrics: train.max_steps, the
    rollout-token budget, early stopping, or not finished (killed, or still running; its final
    evaluation missing; or stopped before its first checkpoint, so it is started again)."""
    train, ev = cfg.get("train") or {}, cfg.get("eval") or {}
    steps = [h for h in history if "rollout/reward_mean" in h]
    if "max_steps" not in train:
        return None
    if not steps:  # a run that failed (or was killed) before its first step was logged: the report is empty
        return (f"not finished: no step trained of {train['max_steps']} (it stopped before its first step, or is "
                f"still starting; its error is where it ran); start it again with {start_again_command(run_dir)}")
    last, max_steps = steps[-1]["step"], train["max_steps"]
    budget, tokens = train.get("max_rollout_tokens"), steps[-1].get("rollout/tokens_total", 0)
    since = [h["eval/evals_since_best"] for h in history if "eval/evals_since_best" in h]
    patience = ev.get("early_stopping_patience") or 0
    reason = None
    if last >= max_steps:
        reason = f"train.max_steps={max_steps}"
    elif budget is not None and tokens >= budget:
        reason = f"the rollout-token budget (train.max_rollout_tokens={budget}) at step {last} of {max_steps}"
    elif patience and since and since[-1] >= patience:
        reason = f"early stopping (eval.early_stopping_patience={patience}) at step {last} of {max_steps}"
    ckpt = checkpointed_step(run_dir)
    if reason and not final_eval_missing(cfg, history, last):
        return reason
    if reason and ckpt is not None and ckpt >= last:  # the checkpoint comes before the final evaluation
        return (f"not finished: step {last} of {max_steps} trained, its final evaluation (eval.at_end) missing "
                f"(killed during it, or still running); `rollwise train --resume {run_dir}` makes it")
    if ckpt is None:
        return (f"not finished: step {last} of {max_steps} (killed before its first checkpoint, or still running); "
                f"no checkpoint in {Path(run_dir) / 'checkpoints'} to resume from (run.save_every sets how often they "
                f"are written): start it again with {start_again_command(run_dir)}")
    return (f"not finished: step {last} of {max_steps} (killed, or still running); "
            f"`rollwise train --resume {run_dir}` continues from its last checkpoint")


def resumes(envs: list[dict[str, Any]]) -> str | None:
    """Where the run was resumed and what each resume changed, from environment.json's entries
    ("step 2 (train.max_steps: 2 -> 4); step 5"); None for a run never resumed."""
    parts = []
    for e in envs:
        if e.get("resumed_from_step") is None:
            continue
        changed = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in (e.get("config_changes") or {}).items())
        parts.append(f"step {e['resumed_from_step']}" + (f" ({changed})" if changed else ""))
    return "; ".join(parts) or None


def print_summary(run_dir: Path, title: str | None = None) -> dict[str, Any]:
    from rollwise.environment import environment_entries
    from rollwise.tracking import read_metrics
    from rollwise.training.best import best_dir, read_best

    history = read_metrics(run_dir, warn=False)  # the report's plot has said it already
    summary = summarize(history)
    cfg = run_config(run_dir)
    reason = stop_reason(cfg, history, run_dir)
    if reason:
        summary = {"steps": summary["steps"], "stopped by": reason, **summary}
    planner = cfg.get("planner")
    strategy = planner.get("strategy") if isinstance(planner, dict) else None
    if strategy:
        summary = {"planner": str(strategy), **summary}
    entries = environment_entries(run_dir)  # the start, then one per resume
    resumed = resumes(entries)
    if resumed:
        summary["resumed at"] = resumed
    env = entries[0] if entries else None
    if env:
        cpu, pk = env["cpu"], env["packages"]
        summary["computed on"] = (f"{cpu['model']} ({cpu.get('torch_capability') or '?'}), {env['torch_threads']} "
                                  f"threads{', ' + env['cuda'] if env.get('cuda') else ''}"
                                  f"{', ' + env['compute_dtype'] if env.get('compute_dtype') else ''}; torch {pk.get('torch')}, "
                                  f"transformers {pk.get('transformers')}")
    if len(entries) > 1:  # a resume may run on another machine, dtype or library version: "computed on" is the start's
        from rollwise.environment import compare_environments

        segments = {"start" if e.get("resumed_from_step") is None else f"resumed at step {e['resumed_from_step']}": e
                    for e in entries}
        changed = [ln for ln in compare_environments(segments) if not ln.startswith("no environment.json")]
        if changed:
            summary["environment changed at a resume"] = "; ".join(changed)
    saved = read_best(run_dir)
    if saved:
        # its accuracy too: with eval.early_stopping_min_delta the saved best need not be "eval accuracy (best)"
        acc = saved.get("accuracy")
        summary["best weights (eval.save_best)"] = (f"{best_dir(run_dir)} (step {saved['step']}"
                                                    + (f", accuracy {acc:.3f})" if isinstance(acc, (int, float)) else ")"))
    table = Table(title=escape(title or f"rollwise run {run_dir}"))  # a path "sweep[lr]" is no markup
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in summary.items():
        table.add_row(escape(k), escape(str(v)))
    Console().print(table)
    return summary
