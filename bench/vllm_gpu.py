"""The prepared GPU check for the vllm engine (issue 5). Run it on a machine with a CUDA GPU:

    bash bench/vllm_gpu.sh            # installs the vllm extra, runs this, writes bench/out/vllm_gpu/

1. Throughput on one batch: bare vLLM (`LLM.generate`, n samples per prompt, the same sampling
   settings) against rollwise's VLLMEngine (`generate`, which steps vLLM's engine itself so it
   can stop and resume rounds), side by side, tokens per second and the ratio.
2. A short training run: `rollwise train` on SmolLM2-135M-Instruct with rollout.engine=vllm and
   model.device=cuda, 5 steps, held-out accuracy before and after.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def throughput(model_path: str, prompts: list[list[int]], n: int, max_tokens: int, eos: int, pad: int) -> dict:
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from rollwise.engine import GenerationRequest
    from rollwise.engine.vllm import VLLMEngine

    eng = VLLMEngine(model_path, [eos], pad, torch.bfloat16, gpu_memory_utilization=0.35, max_model_len=512)
    reqs = [GenerationRequest(p, max_tokens, temperature=1.0) for p in prompts for _ in range(n)]
    eng.generate(reqs[:8])  # warm-up
    t0 = time.perf_counter()
    outs = eng.generate(reqs)
    ours_s = time.perf_counter() - t0
    ours_tok = sum(len(o.response_ids) for o in outs)
    llm: LLM = eng.llm
    params = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, logprobs=0, stop_token_ids=[eos])
    t0 = time.perf_counter()
    res = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    bare_s = time.perf_counter() - t0
    bare_tok = sum(len(c.token_ids) for r in res for c in r.outputs)
    return {"rollwise_tok_s": ours_tok / ours_s, "bare_vllm_tok_s": bare_tok / bare_s,
            "ratio": (ours_tok / ours_s) / (bare_tok / bare_s), "samples": len(reqs)}


def main() -> None:
    out = Path("bench/out/vllm_gpu")
    out.mkdir(parents=True, exist_ok=True)
    from rollwise.config import load_config
    from rollwise.data import build_items, encode_prompts
    from rollwise.loop import train
    from rollwise.models import load_tokenizer, resolve_model_path

    cfg = load_config(None, [])
    path = resolve_model_path(cfg.model.name_or_path, cfg.model.cache_dir)
    tok = load_tokenizer(path)
    items, _ = build_items(cfg.data, 0)
    ids, _ = encode_prompts(items[:64], tok, cfg.data)
    figures = {"throughput": throughput(path, ids, 8, 256, tok.eos_token_id, tok.pad_token_id)}
    print(json.dumps(figures["throughput"], indent=2), flush=True)
    res = train(load_config(None, ["rollout.engine=vllm", "model.device=cuda", "train.max_steps=5", "run.save_every=0",
                                   f"run.output_dir={out}", "run.name=train", "run.progress=false"]), quiet=True)
    figures["train"] = {"before": res.eval_before.get("eval/accuracy"), "after": res.eval_after.get("eval/accuracy"),
                        "median_step_s": sorted(r["time/step_s"] for r in res.history)[len(res.history) // 2]}
    print(json.dumps(figures["train"], indent=2))
    (out / "results.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    sys.exit(main())
