"""How many reasoning-gym basic_arithmetic items carry a gold answer that is not the exact value of
the expression in their question (`rollwise.data.tasks.arithmetic_truth`, usual operator precedence),
for a few parameter settings; rollwise leaves such items out of its data with a warning.

    .venv/bin/python bench/arithmetic_gold.py            # 400 items per setting, seed 1, a few seconds
    .venv/bin/python bench/arithmetic_gold.py --n 2000
"""

from __future__ import annotations

import argparse
import importlib.metadata

import reasoning_gym

from rollwise.data.tasks import wrong_gold
from rollwise.types import PromptItem

SETTINGS = {
    "reasoning-gym defaults (2-6 terms, + - * /, parentheses)": {},
    "defaults without division": {"operators": ["+", "-", "*"]},
    "allow_parentheses=false": {"allow_parentheses": False},
    "allow_parentheses=false, + - * only": {"allow_parentheses": False, "operators": ["+", "-", "*"]},
    "rollwise's default mixture entry (2 terms, 1-2 digits, no parentheses, + - *)": {
        "min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "allow_negation": False,
        "allow_parentheses": False, "operators": ["+", "-", "*"]},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(f"basic_arithmetic, reasoning-gym {importlib.metadata.version('reasoning-gym')} (its __version__ says {reasoning_gym.__version__}), {args.n} items per setting, seed {args.seed}")
    print(f"{'setting':<80} {'wrong gold':>10} {'with /':>7} {'wrong, with /':>14}")
    for name, params in SETTINGS.items():
        ds = reasoning_gym.create_dataset("basic_arithmetic", size=args.n, seed=args.seed, **params)
        items = [PromptItem(str(i), "basic_arithmetic", e["question"], str(e["answer"]), e) for i, e in enumerate(ds)]
        wrong = [it for it in items if wrong_gold(it)]
        div = sum("/" in it.question for it in items)
        print(f"{name:<80} {len(wrong):>10} {div:>7} {sum('/' in it.question for it in wrong):>14}")
        if wrong:
            it = wrong[0]
            print(f"    e.g. {it.question!r} gold {it.answer}")


if __name__ == "__main__":
    main()
