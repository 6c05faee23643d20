"""Does speculative reuse give what fresh sampling gives, under the same weights?

    .venv/bin/python bench/spec_stickiness.py RUN_DIR [--repeats 4]      # ~8 min on one busy core

RUN_DIR is a finished `bench/spec_reuse.py` reuse run (its last checkpoint holds the executor's
bank of earlier responses). Under that checkpoint's weights, for every prompt in the bank:

- reuse: the banked responses verified and continued, as `rollout.speculative_reuse` does
  at the prompt's next visit (the bank is restored before each repeat);
- fresh: as many new samples of the same weights.

Printed per arm: solve rate, share of groups with at least one correct response, share of
informative groups (mixed rewards), mean length and truncation, and the same split by what
the banked group was (all wrong, all correct, mixed). Exact reuse of responses that are a
plain draw of the old policy, independent of the new weights, gives the same figures in both
arms up to sampling noise.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import tempfile
from pathlib import Path

import yaml

from rollwise.config import build_config
from rollwise.engine.executor import RolloutExecutor
from rollwise.evaluate import is_correct
from rollwise.loop import setup
from rollwise.models import merged_state_dict
from rollwise.planner.base import Request


def score(run, uid: str, outs) -> list[bool]:
    texts = [run.tokenizer.decode(o.response_ids, skip_special_tokens=True) for o in outs]
    scored = run.runner.score(texts, [run.items_by_uid[uid]] * len(outs))
    return [is_correct(p, run.primary) for p in scored.parts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--repeats", type=int, default=4, help="groups per prompt and arm")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    src = Path(args.run_dir)
    work = Path(tempfile.mkdtemp()) / src.name  # setup(resume=...) writes into the run folder: use a copy
    shutil.copytree(src, work)
    saved = yaml.safe_load((work / "config.yaml").read_text())
    saved["rollout"].pop("spec_source", None)  # a key of a reverted experiment (commit 9c37c82)
    saved["run"]["torch_threads"] = args.threads
    (work / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    cfg = build_config(saved)
    run = setup(cfg, resume=str(work))
    ro = cfg.rollout
    run.engine.load_weights(merged_state_dict(run.model), version=run.start_step)
    bank0 = run.state["extra"]["executor"]["bank"]
    kinds = {}
    for uid, outs in bank0.items():
        ok = score(run, uid, outs)
        kinds[uid] = "all wrong" if not any(ok) else "all correct" if all(ok) else "mixed"
    print(f"{src}: step {run.start_step}, {len(bank0)} banked prompts "
          f"({', '.join(f'{k}: {list(kinds.values()).count(k)}' for k in ('all wrong', 'all correct', 'mixed'))})")
    arms: dict[str, list[tuple[str, list[bool], list[int]]]] = {"reuse": [], "fresh": []}
    for arm in arms:
        ex = RolloutExecutor(run.engine, run.ids_by_uid, ro.max_completion_length, ro.temperature,
                             speculative=arm == "reuse", lenience=ro.spec_lenience)
        for _ in range(args.repeats):
            ex.bank = copy.deepcopy(bank0)
            for uid, outs in bank0.items():
                got = ex.generate([Request(uid, len(outs))]).groups[uid]
                arms[arm].append((uid, score(run, uid, got), [len(o.response_ids) for o in got]))
    print(f"{'arm':<7}{'banked group':<13}{'groups':>7}{'solve rate':>11}{'any correct':>12}{'informative':>12}"
          f"{'length':>8}{'truncated':>10}")
    for arm, rows in arms.items():
        for kind in ("all", "all wrong", "all correct", "mixed"):
            sel = [r for r in rows if kind == "all" or kinds[r[0]] == kind]
            if not sel:
                continue
            ok = [x for _, o, _ in sel for x in o]
            lens = [x for _, _, ln in sel for x in ln]
            print(f"{arm:<7}{kind:<13}{len(sel):>7}{statistics.mean(ok):>11.2f}"
                  f"{statistics.mean(any(o) for _, o, _ in sel):>12.2f}"
                  f"{statistics.mean(any(o) and not all(o) for _, o, _ in sel):>12.2f}"
                  f"{statistics.mean(lens):>8.1f}{statistics.mean(n >= ro.max_completion_length for n in lens):>10.0%}")
    run.runner.close()


if __name__ == "__main__":
    main()
