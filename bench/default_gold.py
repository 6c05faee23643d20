"""Are reasoning-gym's gold answers right for rollwise's default mixture (chain_sum, products, gcd, lcm)?

For each setting below (the default mixture's parameters, and wider ones users are likely to pick), N items
are drawn as rollwise draws them (`reasoning_gym.create_dataset(name, size=N, seed=S, **params)`), the numbers
and operators are read out of the question text with a regex (not from the item's metadata), the true answer
is computed exactly (integers; * before + and -; math.gcd / math.lcm) and compared with the gold answer string.

Columns: wrong gold (the gold is not the true value), odd format (same value, but not written as str(int),
e.g. "1,000", "-0", "+5", "12.0"), unparsed (questions the regex could not read: counted and shown, never
skipped silently), metadata mismatch (the metadata's expression / numbers differ from what the question says).
basic_arithmetic is checked by bench/arithmetic_gold.py. Exit status is always 0: this is a measurement.

    .venv/bin/python bench/default_gold.py                 # 1000 items per setting, seed 1
    .venv/bin/python bench/default_gold.py --n 5000 --seed 7
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import re
from functools import reduce

import reasoning_gym

MIXTURE_ARITH = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}
WIDE_ARITH = {"min_terms": 3, "max_terms": 5, "min_digits": 1, "max_digits": 4}
SETTINGS: list[tuple[str, dict]] = [
    ("chain_sum", MIXTURE_ARITH),
    ("chain_sum", {}),  # reasoning-gym defaults: 2-6 terms, 1-4 digits
    ("chain_sum", WIDE_ARITH),
    ("chain_sum", {**WIDE_ARITH, "allow_negation": True}),
    ("products", MIXTURE_ARITH),
    ("products", {}),  # reasoning-gym defaults: 2 terms, 1-5 digits
    ("products", WIDE_ARITH),
    ("products", {**WIDE_ARITH, "allow_negation": True}),
    ("gcd", {"min_value": 1, "max_value": 99}),
    ("gcd", {}),  # reasoning-gym defaults: 2 numbers, 1-1000
    ("gcd", {"min_numbers": 3, "max_numbers": 5, "min_value": 1, "max_value": 10000}),
    ("lcm", {"min_value": 1, "max_value": 20}),
    ("lcm", {}),  # reasoning-gym defaults: 2 numbers, 1-100
    ("lcm", {"min_numbers": 3, "max_numbers": 5, "min_value": 1, "max_value": 1000}),
]
MIXTURE = {0, 4, 8, 11}  # indices of the default mixture's entries

_EXPR = r"(-?\d+(?: [-+*] -?\d+)*)"  # space-separated integers (possibly negative) and operators
QUESTION = {
    "chain_sum": re.compile(rf"State the final answer to the following arithmetic problem: {_EXPR} ="),
    "products": re.compile(rf"Solve the following multiplication: {_EXPR}\. Give only the result as your final answer\."),
    "gcd": re.compile(r"Find the Greatest Common Divisor \(GCD\) of these numbers: (\d+(?:, \d+)*)\. "
                      r"Give only the GCD as your final answer\."),
    "lcm": re.compile(r"Find the Least Common Multiple \(LCM\) of these numbers: (\d+(?:, \d+)*)"),
}


def evaluate(expr: str) -> int:
    """Exact value of "a op b op c ..." (integers, + - *), with * binding tighter than + and -."""
    tokens = expr.split()
    total, term, sign = 0, int(tokens[0]), 1
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            term *= int(num)
        else:
            total += sign * term
            term, sign = int(num), (1 if op == "+" else -1)
    return total + sign * term


def truth(task: str, question: str) -> tuple[int, object] | None:
    """(true answer, what was parsed) from the question text alone; None when it cannot be parsed."""
    m = QUESTION[task].fullmatch(question.strip())
    if m is None:
        return None
    if task in ("chain_sum", "products"):
        expr = m.group(1)
        if task == "products" and re.search(r" [-+] ", expr) or task == "chain_sum" and " * " in expr:
            return None  # an operator the task should not have
        return evaluate(expr), expr
    numbers = [int(x) for x in m.group(1).split(", ")]
    return reduce(math.gcd if task == "gcd" else math.lcm, numbers), numbers


def cut(s: str, k: int = 90) -> str:
    return s if len(s) <= k else s[: k - 3] + "..."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="items per setting (default 1000)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(f"reasoning-gym {importlib.metadata.version('reasoning-gym')}, {args.n} items per setting, seed {args.seed}"
          " (* = rollwise's default mixture entry)\n")
    print("| task | params | items | wrong gold | odd format | unparsed | metadata mismatch | examples |")
    print("|---|---|---|---|---|---|---|---|")
    for k, (task, params) in enumerate(SETTINGS):
        ds = reasoning_gym.create_dataset(task, size=args.n, seed=args.seed, **params)
        wrong, odd, unparsed, meta_bad, examples = 0, 0, 0, 0, []
        for e in ds:
            q, gold, meta = str(e["question"]), str(e["answer"]), e.get("metadata") or {}
            got = truth(task, q)
            if got is None:
                unparsed += 1
                if len(examples) < 2:
                    examples.append(f"UNPARSED {cut(q)!r}")
                continue
            true, parsed = got
            meta_bad += parsed != meta.get("expression" if task in ("chain_sum", "products") else "numbers")
            try:
                value = int(gold.replace(",", "").strip())
            except ValueError:
                value = None
            if value != true:
                wrong += 1
                if len(examples) < 2:
                    examples.append(f"{cut(q)!r} -> gold {gold!r}, true {true}")
            elif gold != str(true):
                odd += 1
                if len(examples) < 2:
                    examples.append(f"ODD FORMAT {cut(q)!r} -> gold {gold!r}, true {true}")
        star = "*" if k in MIXTURE else ""
        shown = ", ".join(f"{a}={b}" for a, b in params.items()) or "(reasoning-gym defaults)"
        print(f"| {task}{star} | {shown} | {len(ds)} | {wrong} | {odd} | {unparsed} | {meta_bad} | "
              f"{'<br>'.join(x.replace('|', '/') for x in examples)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
