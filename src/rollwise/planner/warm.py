"""`planner.prior_counts`: start a planner's belief from solve counts measured before training.

A row {"uid": u, "successes": s, "samples": n} of the JSONL file is given to the estimator as one
visit of n rollouts with s correct, before the first step, then the estimator's end-of-step
update runs once (the `irt` estimator learns its pool and task priors from those prompts). The
rollouts behind the file are not the run's: they count in no budget and no metric.
"""

from __future__ import annotations

import json
from pathlib import Path

from rollwise.config import ConfigError
from rollwise.planner.estimators import Estimator


def read_prior_counts(path: str | Path) -> dict[str, tuple[int, int]]:
    """uid -> (successes, samples) from a JSONL file; a clear error for a missing file or a bad row."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"planner.prior_counts: no file '{p}'; give a JSONL file of "
                                '{"uid": ..., "successes": S, "samples": N} rows (bench/pool_rates.py writes one)')
    out: dict[str, tuple[int, int]] = {}
    for line_no, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"planner.prior_counts: {p}, line {line_no}"
        try:
            row = json.loads(line)
            uid, s, n = row["uid"], row["successes"], row["samples"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConfigError(f'{where}: expected {{"uid": ..., "successes": S, "samples": N}}, got {line[:80]!r} '
                             f"({type(e).__name__}: {e})") from None
        if not (isinstance(s, int) and isinstance(n, int) and 0 <= s <= n and n > 0):
            raise ConfigError(f"{where}: successes and samples must be whole numbers with 0 <= successes <= samples "
                             f"and samples >= 1, got successes={s!r}, samples={n!r}")
        if str(uid) in out:
            raise ConfigError(f"{where}: uid '{uid}' is listed twice")
        out[str(uid)] = (s, n)
    return out


def warm_start(estimator: Estimator, index: dict[str, int], counts: dict[str, tuple[int, int]], source: str) -> int:
    """Give `estimator` each pool prompt's counts as one visit, then its end-of-step update; the
    number of prompts warmed. None of the file's uids in the pool is an error: the file was
    measured on other data."""
    known = [(index[u], s, n) for u, (s, n) in counts.items() if u in index]
    if not known:
        some = ", ".join(list(counts)[:3])
        raise ConfigError(f"planner.prior_counts: none of the {len(counts)} uids in {source} (e.g. {some}) is in this "
                         f"run's training pool of {len(index)} prompts; measure the file on this run's data "
                         "(the same data.* settings and run.seed)")
    for i, s, n in known:
        estimator.update(i, s, n)
    estimator.after_step()
    return len(known)
