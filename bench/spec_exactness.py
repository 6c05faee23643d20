"""Is speculative reuse exact when the new weights did not see the old responses?

    .venv/bin/python bench/spec_exactness.py NEW_WEIGHTS.safetensors     # ~6 min on one core

e.g. NEW_WEIGHTS = bench/out/spec_fp32_s1/seed1-plain/checkpoints/step_000024/weights.safetensors
(the final weights of a plain `bench/spec_reuse.py` run). Old policy: SmolLM2-135M-Instruct as
shipped; new policy: NEW_WEIGHTS. Both in fp32, temperature 1, 48 new tokens, default mixture.

1. Pipeline. 8 prompts x 32 old responses are verified under the new weights (top-32 stored per
   token) and continued; their length and truncation are set against 8 x 32 fresh samples of
   the new weights. Exact reuse gives the same distribution.
2. Stored top-k. At every position of 64 old responses, the residual rebuilt from the old
   top-k (`old_distribution_from_topk`) is compared with the one from the full old distribution:
   mean P(reject) x TV(exact residual, rebuilt residual), the error it adds to that position's
   output distribution.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from safetensors.torch import load_file

from rollwise.algos.speculative import old_distribution_from_topk, residual_distribution
from rollwise.config import load_config
from rollwise.data import build_items, encode_prompts
from rollwise.engine import GenerationOutput, GenerationRequest
from rollwise.engine.continuous import ContinuousEngine
from rollwise.models import load_model, load_tokenizer, resolve_model_path

MAX_NEW = 48


def summary(name: str, outs: list[GenerationOutput], eos: list[int]) -> None:
    lengths = [len(o.response_ids) for o in outs]
    cut = sum(len(o.response_ids) >= MAX_NEW and o.response_ids[-1] not in eos for o in outs) / len(outs)
    print(f"  {name:<24} mean length {statistics.mean(lengths):5.1f}   truncated {cut:.0%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("weights")
    ap.add_argument("--seed", type=int, default=1, help="data seed (the prompts)")
    ap.add_argument("--samples", type=int, default=32, help="samples per prompt in the pipeline check")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(None, ["data.train_size=24", "data.eval_size=8", f"run.seed={args.seed}"])
    path = resolve_model_path(cfg.model.name_or_path, None)
    tok = load_tokenizer(path)
    old_model = load_model(path, torch.float32).eval()
    new_model = load_model(path, torch.float32).eval()
    new_sd = load_file(args.weights)
    new_model.load_state_dict(new_sd, strict=False)  # a tied lm_head is not stored
    items, _ = build_items(cfg.data, args.seed)
    ids, _ = encode_prompts(items, tok, cfg.data)
    gen_eos = old_model.generation_config.eos_token_id
    eos = sorted({tok.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])} - {None})

    engine = ContinuousEngine(old_model, eos, tok.pad_token_id, torch.float32, 64, seed=0, num_slots=64,
                              record_topk=32)
    reqs = [GenerationRequest(p, MAX_NEW, 1.0) for p in ids[:8] for _ in range(args.samples)]
    olds = engine.generate(reqs)
    engine.load_weights(new_model.state_dict(), 1)  # every name, the tied head included
    fresh = engine.generate(reqs)
    verified = engine.verify([r.prompt_ids for r in reqs], olds, 1.0, 1.0, MAX_NEW)
    todo = [i for i, v in enumerate(verified) if not isinstance(v, GenerationOutput)]
    reused: list = list(verified)
    for i, o in zip(todo, engine.generate([verified[i] for i in todo])):  # type: ignore[misc]
        reused[i] = o
    st = engine.stats
    print(f"1. pipeline: acceptance {st['spec_accepted_tokens'] / st['spec_old_tokens']:.0%}, "
          f"{len(reqs) - len(todo)} of {len(reqs)} kept whole")
    summary("old (old weights)", olds, eos)
    summary("fresh (new weights)", fresh, eos)
    summary("reused (verify+continue)", reused, eos)

    errs = {k: 0.0 for k in (32, 256, 1024)}
    positions, reject = 0, 0.0
    with torch.no_grad():
        for r, o in zip(reqs[:: args.samples // 8], olds[:: args.samples // 8]):  # 64 old responses
            x = torch.tensor([r.prompt_ids + o.response_ids])
            s, n = len(r.prompt_ids) - 1, len(o.response_ids)
            lo = torch.log_softmax(old_model(x).logits[0, s:s + n].double(), -1)  # [n, V]
            ln = torch.log_softmax(new_model(x).logits[0, s:s + n].double(), -1)
            for i in range(n):
                po, pn = lo[i].exp(), ln[i].exp()
                rej = float((pn - torch.minimum(pn, po)).sum())
                exact = residual_distribution(pn, po)
                positions += 1
                reject += rej
                for k in errs:
                    tp, ti = po.topk(k)
                    rebuilt = residual_distribution(pn, old_distribution_from_topk(pn, ti, tp.to(torch.float16)))
                    errs[k] += rej * 0.5 * float((exact - rebuilt).abs().sum())
    print(f"2. stored top-k over {positions} positions: mean P(reject) {reject / positions:.3f}")
    for k, e in errs.items():
        print(f"  top-{k:<5} mean P(reject) x TV(exact residual, rebuilt) {e / positions:.4f}")


if __name__ == "__main__":
    main()
