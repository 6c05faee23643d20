"""Does a correct answer score 1.0? Gold-answer self-check of every reasoning-gym task rollwise loads.

For each task, N items are built by rollwise's own `rollwise.data.build_items` (the training items of a
one-task mixture, seed `run.seed`, the task's default parameters; the default mixture's tasks also once
with the mixture's parameters), and completions that state the item's gold answer are scored through
rollwise's own reward path: `RewardRunner` (the process-isolated worker, with `reward.timeout`) running the
default `reward.functions` (reasoning_gym), the verifier every reasoning-gym task gets by default.

Completions written for each gold answer X (see `VARIANTS`):

  instructed  what the default `data.instruction` asks for. It is "" (the prompt is the bare question), so
              this is X alone (also the only form `format_reward` accepts); an instruction naming
              "####", "\\boxed" or "<answer>" would give "#### X", "\\boxed{X}" or "<answer>X</answer>".
  tag         "<answer>X</answer>"          (extraction rule 1 of rollwise.rewards.verifiers)
  boxed       "\\boxed{X}"                  (rule 2)
  sentence    "...reasoning...\\nThe answer is X."  (rule 3: last line, "the answer is" prefix, final period)
  bold        "**X**"                       (rule 3: markdown decoration)

Every one must score 1.0. The table gives, per task: items built, the share of all its completions
scoring 1.0 and their mean score, the share per variant, and one failure (variant, gold, completion,
extracted answer, score). Tasks that cannot be built (an exception, or longer than --build-timeout) are
listed separately with the error; they do not stop the script. Hugging Face hubs are set offline unless
HF_HUB_OFFLINE / HF_DATASETS_OFFLINE are already set.

Exit status: 1 if any completion of a task that was built scores below 1.0, else 0 (tasks that failed to
build are reported but do not change it).

Run (from the repository root; ~2 cores, nice'd):

    nice -n 19 .venv/bin/python bench/gold_selfcheck.py --n 10
    nice -n 19 .venv/bin/python bench/gold_selfcheck.py --tasks chain_sum,gcd --n 20
    nice -n 19 .venv/bin/python bench/gold_selfcheck.py --mixture-only --n 50
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from rollwise.config import TaskSpec, load_config  # noqa: E402
from rollwise.data import build_items  # noqa: E402
from rollwise.rewards import RewardRunner  # noqa: E402
from rollwise.rewards.verifiers import extract_answer  # noqa: E402
from rollwise.types import PromptItem  # noqa: E402


def instructed(instruction: str, gold: str) -> str:
    """The completion the instruction asks for (a bare answer when the instruction is empty or names no form)."""
    low = instruction.lower()
    if "<answer>" in low:
        return f"<answer>{gold}</answer>"
    if "\\boxed" in low or "boxed" in low:
        return f"\\boxed{{{gold}}}"
    if "####" in low:
        return f"Let me work it out.\n#### {gold}"
    return gold


VARIANTS = {
    "instructed": None,  # filled from data.instruction
    "tag": lambda g: f"Let me work it out.\n<answer>{g}</answer>",
    "boxed": lambda g: f"Let me work it out.\nSo the result is \\boxed{{{g}}}.",
    "sentence": lambda g: f"Let me work it out.\nThe answer is {g}.",
    "bold": lambda g: f"Let me work it out.\n**{g}**",
}


@dataclass
class Row:
    label: str
    items: int = 0
    scores: dict[str, list[float]] = field(default_factory=dict)  # variant -> scores
    failure: tuple | None = None  # (variant, gold, completion, extracted, score)
    messages: list[str] = field(default_factory=list)  # reward worker errors / timeouts
    warnings: list[str] = field(default_factory=list)  # build_items warnings
    seconds: float = 0.0


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


class _BuildTimeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _BuildTimeout


def build(spec: TaskSpec, n: int, seed: int, data_cfg, timeout: int, capture: _Capture) -> list[PromptItem]:
    """The N training items rollwise builds for a one-task mixture of `spec`."""
    cfg = data_cfg.model_copy(update={"tasks": [spec], "train_size": n, "eval_size": 0})
    capture.records.clear()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        train, evals = build_items(cfg, seed)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return train + evals


def short(s: str, k: int = 70) -> str:
    r = repr(s)
    return r if len(r) <= k else r[: k - 3] + "..."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20, help="items per task (default 20)")
    ap.add_argument("--tasks", default=None,
                    help="comma-separated reasoning-gym names, default parameters (default: every registered "
                         "generator, plus the default mixture's tasks with the mixture's parameters)")
    ap.add_argument("--mixture-only", action="store_true", help="only the default mixture (its parameters)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    ap.add_argument("--seed", type=int, default=None, help="build_items seed (default: run.seed)")
    ap.add_argument("--build-timeout", type=int, default=120, help="seconds to build one task's items")
    args = ap.parse_args()

    cfg = load_config()
    seed = cfg.run.seed if args.seed is None else args.seed
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = sorted(set(variants) - set(VARIANTS))
    if bad:
        ap.error(f"unknown variants {bad}; choose from {list(VARIANTS)}")
    forms = {v: (lambda g: instructed(cfg.data.instruction, g)) if v == "instructed" else VARIANTS[v]
             for v in variants}

    specs: list[tuple[str, TaskSpec]] = []
    if args.tasks:
        specs = [(t, TaskSpec(name=t)) for t in (s.strip() for s in args.tasks.split(",")) if t]
    else:
        specs = [(f"{t.name} [mixture]", t) for t in cfg.data.tasks]
        if not args.mixture_only:
            from reasoning_gym.factory import DATASETS

            specs += [(name, TaskSpec(name=name)) for name in sorted(DATASETS)]

    capture = _Capture()
    logging.getLogger("rollwise").addHandler(capture)
    logging.getLogger("rollwise").propagate = False

    print(f"gold self-check: {len(specs)} task configurations, n={args.n}, seed={seed}, "
          f"instruction={cfg.data.instruction!r}, reward.functions="
          f"{[(f.name, f.weight) for f in cfg.reward.functions]}, variants={variants}", flush=True)
    t0 = time.time()
    rows: list[Row] = []
    broken: list[tuple[str, str]] = []
    with RewardRunner(cfg.reward) as runner:
        for label, spec in specs:
            t = time.time()
            try:
                items = build(spec, args.n, seed, cfg.data, args.build_timeout, capture)
            except _BuildTimeout:
                broken.append((label, f"building {args.n} items took over {args.build_timeout} s"))
                print(f"  {label}: BUILD TIMEOUT", flush=True)
                continue
            except Exception as e:  # noqa: BLE001  (reported, never stops the check)
                broken.append((label, f"{type(e).__name__}: {str(e)[:300]}"))
                print(f"  {label}: BUILD ERROR {type(e).__name__}", flush=True)
                continue
            row = Row(label, items=len(items), warnings=list(capture.records))
            if not items:
                broken.append((label, "built 0 items" + (f" ({row.warnings[0]})" if row.warnings else "")))
                continue
            completions, owners = [], []
            for v, form in forms.items():
                for it in items:
                    completions.append(form(it.answer))
                    owners.append((v, it))
            result = runner.score(completions, items=[it for _, it in owners])
            row.messages = result.messages
            for (v, it), c, s in zip(owners, completions, result.rewards):
                row.scores.setdefault(v, []).append(s)
                if s < 1.0 - 1e-9 and (row.failure is None or (row.failure[0] != "instructed" and v == "instructed")):
                    row.failure = (v, it.answer, c, extract_answer(c), s)
            row.seconds = time.time() - t
            rows.append(row)
            allscores = [s for ss in row.scores.values() for s in ss]
            ok = sum(s >= 1.0 - 1e-9 for s in allscores) / len(allscores)
            print(f"  {label}: {row.items} items, {ok:.0%} at 1.0 ({row.seconds:.1f} s)", flush=True)
    elapsed = time.time() - t0

    # ---------------------------------------------------------------- report
    w = max([len(r.label) for r in rows] + [4])
    head = f"{'task':<{w}}  items  at1.0   mean  " + "  ".join(f"{v[:6]:>6}" for v in variants) + "  failure example"
    print("\n" + head + "\n" + "-" * len(head))
    failing = 0
    for r in rows:
        allscores = [s for ss in r.scores.values() for s in ss]
        share = sum(s >= 1.0 - 1e-9 for s in allscores) / len(allscores)
        mean = sum(allscores) / len(allscores)
        per = "  ".join(f"{sum(s >= 1.0 - 1e-9 for s in r.scores[v]) / len(r.scores[v]):>6.0%}" for v in variants)
        ex = ""
        if r.failure:
            failing += 1
            v, gold, comp, got, score = r.failure
            ex = f"[{v}] gold={short(gold, 50)} completion={short(comp, 60)} extracted={short(got, 40)} score={score:.3g}"
        print(f"{r.label:<{w}}  {r.items:>5}  {share:>5.0%}  {mean:>5.3f}  {per}  {ex}")
        for m in r.messages[:2]:
            print(f"{'':<{w}}  reward worker: {m[:200]}")
        if r.items < args.n:
            print(f"{'':<{w}}  note: built {r.items} of {args.n} items" + (f" ({r.warnings[0]})" if r.warnings else ""))
    if broken:
        print(f"\ntasks that could not be built ({len(broken)}):")
        for label, err in broken:
            print(f"  {label}: {err}")
    print(f"\n{len(rows)} task configurations scored, {failing} with a correct completion below 1.0, "
          f"{len(broken)} not built; {elapsed:.0f} s")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
