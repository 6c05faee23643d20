"""Does planner.budget_tokens hold over a run when its first length guess (max_completion_length / 2) is far
off? uniform, 12,800 tokens a step, max_completion_length 4096 (a guess of 2048), every response 200 tokens.

    .venv/bin/python bench/token_budget_guess.py     # a second
"""
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)
    sys.exit(0)

from rollwise.config import PlannerConfig  # noqa: E402
from rollwise.planner import GroupResult, build_planner  # noqa: E402

for steps in (10, 30):
    uids = [f"u{i}" for i in range(4000)]
    pl = build_planner(PlannerConfig(strategy="uniform", budget_tokens=12_800), uids, 16, 8, 4096, 0)
    spent = 0
    for s in range(steps):
        reqs = pl.begin_step(s)
        pl.observe([GroupResult(q.uid, [0.0] * q.n, [200] * q.n) for q in reqs])
        pl.end_step()
        spent += 200 * sum(q.n for q in reqs)
    print(f"{steps} steps: {spent / (steps * 12_800):.2f} of the budget")
