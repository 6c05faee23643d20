"""Which banked responses speculative reuse takes for a request smaller than the bank, and whether the
output still follows the current policy. A tiny random model, no download.

    .venv/bin/python bench/spec_bank_draw.py              # 150 trials, about 40 s

Per trial: a 2-layer Llama with an 8-token vocabulary (EOS has about 1/8 of the mass, so lengths vary
from 1 to the 16-token cap) generates 8 responses under weights W0; under perturbed weights W1 the
same 8 are verified and reused (step 1); then a probe of 2 is asked for under W1 (step 2), taken from
the bank of 8. At spec_lenience=1 the probe's responses should be distributed as fresh W1 samples:
printed are the mean lengths of the step-1 group, of fresh W1 samples and of the probe (+- SE).
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from spec_bank_size import tiny_llama  # noqa: E402  (bench/, the script's folder)

from rollwise.engine.continuous import ContinuousEngine  # noqa: E402
from rollwise.engine.executor import RolloutExecutor  # noqa: E402
from rollwise.planner.base import Request  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=150)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_llama(vocab=8, hidden=32)
    w1 = {k: v + 0.5 * torch.randn(v.shape, generator=torch.Generator().manual_seed(i + 100))
          for i, (k, v) in enumerate(model.state_dict().items())}

    def engine(seed: int) -> ContinuousEngine:
        return ContinuousEngine(model, [1], 0, dtype=torch.float32, batch_size=16, num_slots=16, seed=seed,
                                record_topk=8)

    group, fresh, probe = [], [], []
    for trial in range(args.trials):
        eng = engine(trial)
        ex = RolloutExecutor(eng, {"a": [2, 3, 4]}, max_new_tokens=16, temperature=1.0, speculative=True)
        ex.generate([Request("a", 8)], first_round=True)  # step 0 under W0
        eng.load_weights(w1, version=1)
        group += [len(o.response_ids) for o in ex.generate([Request("a", 8)], first_round=True).groups["a"]]
        eng.load_weights(w1, version=2)  # W1 again
        probe += [len(o.response_ids) for o in ex.generate([Request("a", 2)], first_round=True).groups["a"]]
        ref = engine(10_000 + trial)
        ref.load_weights(w1, version=1)
        fresh += [len(o.response_ids) for o in RolloutExecutor(ref, {"a": [2, 3, 4]}, 16, 1.0)
                  .generate([Request("a", 2)]).groups["a"]]

    def ms(x: list[int]) -> str:
        return f"{statistics.mean(x):.2f} +- {statistics.stdev(x) / len(x) ** 0.5:.2f} (n={len(x)})"

    print(f"mean response length, step 1's group of 8 (verified and reused): {ms(group)}")
    print(f"mean response length, fresh samples of W1:                        {ms(fresh)}")
    print(f"mean response length, step 2's probe of 2 from the bank of 8:     {ms(probe)}")


if __name__ == "__main__":
    main()
