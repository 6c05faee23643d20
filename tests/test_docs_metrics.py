"""Every metric the code logs is documented (docs/metrics.md, docs/planner.md or the README): a user reads
metrics.jsonl and TensorBoard by these names."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from rollwise.algos.losses import POLICY_LOSSES
from rollwise.algos.offpolicy import OFFPOLICY_CORRECTIONS

ROOT = Path(__file__).parents[1]
NAMESPACES = "rollout|planner|loss|offpolicy|train|eval|async|time|spec|reward|data"


def _documented() -> str:
    return "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def _logged_names() -> set[str]:
    """Metric names written as string literals in the source (an f-string's placeholder becomes a prefix),
    plus the loss and correction metrics, which are the keys of dicts the algorithms return."""
    names = set()
    for path in (ROOT / "src" / "rollwise").rglob("*.py"):
        for m in re.finditer(rf"""f?["']((?:{NAMESPACES})/[A-Za-z0-9_@/]*)(\{{[^}}]*\}})?["']""", path.read_text()):
            if m.group(1).count("/") == 1 and m.group(1).endswith("/"):
                continue  # f"loss/{k}" over a dict's keys: those are listed below (or in the executor's tuple)
            if m.group(1).endswith("/") or m.group(2):
                names.add(m.group(1) + "<")  # a family: eval/accuracy/<task>, eval/pass@<k>
            elif "@" not in m.group(1):
                names.add(m.group(1))
    lp = torch.zeros(2, 3)
    old, adv, mask = lp - 0.1, torch.tensor([1.0, -1.0]), torch.ones(2, 3)
    for name, loss in POLICY_LOSSES.items():
        names |= {f"loss/{k}" for k in loss(lp, old, adv, mask, **({"dual_clip": 3.0} if name == "ppo_clip" else {}))[1]}
    for correct in OFFPOLICY_CORRECTIONS.values():
        names |= {f"offpolicy/{k}" for k in correct(lp, old, mask, torch.ones(2, 3), lp, advantages=adv).metrics}
    return names | {"loss/kl", "loss/entropy"}


def test_every_logged_metric_is_documented():
    docs = _documented()
    names = _logged_names()
    assert len(names) > 80, sorted(names)  # the scan finds the metrics (a broken pattern would pass vacuously)
    missing = sorted(n for n in names if f"`{n}" not in docs and f"`{n.rstrip('<')}<" not in docs)
    assert missing == [], f"logged but documented nowhere (docs/metrics.md): {missing}"
