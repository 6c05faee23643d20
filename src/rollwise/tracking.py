"""Metrics go to `metrics.jsonl` (one line per step or evaluation) and to TensorBoard,
under namespaces that say what they are: rollout/, planner/, loss/, offpolicy/, train/, eval/, time/."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np


class StorageError(RuntimeError):
    """A run's files could not be written (usually a full disk); the message says what to do."""


def _parse(text: str) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """(line, row) for every readable line, and how many lines were unreadable (a line cut short
    by a run killed, or a disk filled, while writing it)."""
    rows, bad = [], 0
    for ln in text.splitlines():
        if not ln.strip():
            continue
        try:
            rows.append((ln, json.loads(ln)))
        except json.JSONDecodeError:
            bad += 1
    return rows, bad


# TensorBoard writes from a thread of its own (one per event file), which re-raises a failed write (a full disk):
# Python printed that thread's traceback before the main thread's next flush raised the same error, which `log`
# turns into rollwise's message. While a Tracker's writer threads live, a hook on threading.excepthook leaves out
# their OSError only: any other thread's error (a user's own threads, their own SummaryWriter) goes to the hook
# that was there before, and that hook is back once no rollwise writer thread is left (Tracker.close).
_quiet_threads: set[threading.Thread] = set()
_quiet_lock = threading.Lock()
_installed_hook: Any = None  # the hook this module set, while it is set


def _writer_threads(writer: Any) -> set[threading.Thread]:
    """The threads that write `writer`'s (a SummaryWriter's) event files."""
    threads = set()
    for fw in (getattr(writer, "all_writers", None) or {}).values():
        worker = getattr(getattr(getattr(fw, "event_writer", None), "_async_writer", None), "_worker", None)
        if isinstance(worker, threading.Thread):
            threads.add(worker)
    return threads


def _quiet_event_writer_errors(threads: set[threading.Thread]) -> None:
    """Leave out the OSError traceback of `threads` (rollwise's own TensorBoard writer threads) until they end."""
    global _installed_hook
    with _quiet_lock:
        _quiet_threads.difference_update([t for t in _quiet_threads if not t.is_alive()])
        _quiet_threads.update(threads)
        if not _quiet_threads or (_installed_hook is not None and threading.excepthook is _installed_hook):
            return
        # a hook set over ours (pytest's, a notebook's) may have put it away: a fresh one goes on top, with the
        # hook found now as the one it passes to (several of ours in a chain only leave out the same errors)
        previous = threading.excepthook

        def hook(args: threading.ExceptHookArgs) -> None:
            if not (args.thread in _quiet_threads and isinstance(args.exc_value, OSError)):
                previous(args)

        hook.rollwise_previous = previous  # type: ignore[attr-defined]
        threading.excepthook = _installed_hook = hook


def _release_event_writer_errors(threads: set[threading.Thread]) -> None:
    """`threads` have ended (or their errors are no longer rollwise's to hide): forget them, and once no
    rollwise writer thread is left, put back the hook that was there before ours."""
    global _installed_hook
    with _quiet_lock:
        _quiet_threads.difference_update(threads)
        _quiet_threads.difference_update([t for t in _quiet_threads if not t.is_alive()])
        if _quiet_threads or _installed_hook is None:
            return
        if threading.excepthook is _installed_hook:  # else a hook set since holds ours: it stays, letting all through
            threading.excepthook = _installed_hook.rollwise_previous
        _installed_hook = None


HISTOGRAMS = ("planner/samples_per_prompt",)  # list-valued metrics TensorBoard shows as a histogram


class Tracker:
    def __init__(self, run_dir: Path, tensorboard: bool = True, truncate_after_step: int | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        if truncate_after_step is not None and self.path.exists():
            # On resume, forget lines written after the checkpoint we resume from (and cut-short ones).
            rows, _ = _parse(self.path.read_text())
            keep = [ln for ln, row in rows if row.get("step", 0) <= truncate_after_step]
            from rollwise.environment import replace_text

            replace_text(self.path, "".join(ln + "\n" for ln in keep))  # whole or not at all: a full disk keeps the old
        self.writer = None
        self._threads: set[threading.Thread] = set()
        if truncate_after_step is not None:  # events an earlier attempt wrote go too, even with TensorBoard off now
            drop_events_after(Path(run_dir) / "tensorboard", truncate_after_step)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step hides events at or after it: keep the checkpoint's own step, as metrics.jsonl does
            purge = None if truncate_after_step is None else truncate_after_step + 1
            self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=purge)
            self._threads = _writer_threads(self.writer)  # its event file's writer thread, started just now
            _quiet_event_writer_errors(self._threads)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: (float(v) if isinstance(v, (int, float)) else v) for k, v in metrics.items()}
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, **clean}) + "\n")
            if self.writer is not None:
                for k, v in clean.items():
                    if isinstance(v, float) and math.isfinite(v):
                        self.writer.add_scalar(k, v, step)
                    elif k in HISTOGRAMS and v:
                        self.writer.add_histogram(k, np.asarray(v, dtype=float), step)
                self.writer.flush()
        except OSError as e:
            from rollwise.training.checkpoint import go_on

            run_dir = self.path.parent
            then = go_on(run_dir, " (it restarts from the last checkpoint; nothing before it is lost), or copy the run "
                         "folder to a disk with room and resume the copy")
            raise StorageError(f"could not write the metrics of step {step} to {run_dir} ({e.strerror}); free disk "
                               f"space, then {then}") from None

    def close(self) -> None:
        """Flush and close the event file; its writer thread ends, and rollwise's hook on threading.excepthook
        goes with the last such thread (closing twice, or after an error, is harmless)."""
        if self.writer is None:
            return
        try:
            self.writer.close()  # joins the writer thread, which has then printed (or not) its error
        finally:
            for t in self._threads:
                # a thread that failed ends on its own (SummaryWriter.close raised at its flush before joining it)
                if t.is_alive() and getattr(t, "exception", None) is not None and t is not threading.current_thread():
                    t.join(timeout=10)
            _release_event_writer_errors({t for t in self._threads if not t.is_alive()})


def drop_events_after(logdir: Path, step: int) -> None:
    """Rewrite the event files in `logdir` without their events after `step`, as metrics.jsonl drops its lines:
    TensorBoard's default reader (its Rust data server) ignores purge_step and replaces a metric's points only
    where the resumed run logs that metric again, so a metric logged on some steps only (rollout/dropped_stale,
    planner/brier_seen) kept the replaced attempt's points. A file left with no event is removed."""
    if not logdir.is_dir():
        return
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    for path in sorted(p for p in logdir.iterdir() if p.is_file() and "tfevents" in p.name):
        # a record cut short by a kill is left out, as a cut-short line of metrics.jsonl is
        events = [(raw, Event.FromString(raw)) for raw in RawEventFileLoader(str(path)).Load()]
        keep = [(raw, ev) for raw, ev in events if ev.step <= step or ev.file_version]
        if len(keep) == len(events):
            continue
        if all(ev.file_version for _, ev in keep):
            path.unlink()
            continue
        tmp = path.with_name("rewrite.tmp")  # no "tfevents" in its name: TensorBoard never reads it
        try:
            with open(tmp, "wb") as f:
                w = RecordWriter(f)
                for raw, _ in keep:
                    w.write(raw)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def read_metrics(run_dir: Path, warn: bool = True) -> list[dict[str, Any]]:
    """Every readable line of RUN_DIR/metrics.jsonl; with `warn`, says on stderr how many were not."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        if (Path(run_dir) / "config.yaml").is_file():  # a run still starting (loading the model) or stopped then
            raise FileNotFoundError(f"{run_dir} has no metrics yet: the run is still starting, or it stopped before "
                                    "its first line (its config.yaml is there)")
        raise FileNotFoundError(f"{path} not found: is '{run_dir}' a rollwise run folder?")
    rows, bad = _parse(path.read_text())
    if bad and warn:
        print(f"rollwise: skipped {bad} unreadable line{'s' if bad > 1 else ''} of {path} (cut short by a run "
              "that stopped while writing)", file=sys.stderr)
    return latest(row for _, row in rows)


def latest(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines of metrics.jsonl with a step or an evaluation logged twice counted once, the later line winning
    (a resume drops the lines after its checkpoint, so only a file from elsewhere, or edited, holds such)."""
    rows = list(rows)

    def key(r: dict[str, Any]) -> tuple[str, Any] | None:
        kind = "step" if "rollout/reward_mean" in r else "eval" if "eval/accuracy" in r else None
        return (kind, r.get("step")) if kind else None

    keys = [key(r) for r in rows]
    last = {k: i for i, k in enumerate(keys) if k}
    return [r for i, (r, k) in enumerate(zip(rows, keys)) if k is None or last[k] == i]
