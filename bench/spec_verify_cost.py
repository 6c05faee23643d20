"""What verification costs against generation on this machine: the bound on speculative reuse's time.

    .venv/bin/python bench/spec_verify_cost.py               # fp32, 2 threads, ~1 min
    .venv/bin/python bench/spec_verify_cost.py --prompts 16 --threads 1
    python bench/spec_verify_cost.py --device cuda --prompts 64   # on a GPU (bench/vllm_gpu.sh runs it)
    PYTHONPATH=src python3 bench/spec_verify_cost.py --device cuda --random-init   # needs torch + transformers only

SmolLM2-135M-Instruct generates `--prompts` default-mixture prompts x 8 responses with the
continuous engine (`--dtype`, T=1, 48 new tokens), then `ContinuousEngine.verify` scores the same
responses under the same weights (so every token is accepted: the cost of verification alone).
Both are timed side by side in one process. With acceptance a and verification r times faster
per token than generation, reuse costs at least 1/r + (1 - a) of plain generation (before the
accepted prefix is prefilled again to continue), so the script prints that bound for the
acceptance rates measured in training.

`--random-init` builds a randomly initialised model of SmolLM2-135M's shape and random prompts
instead (no model package, no data, no rollwise config: torch and transformers are enough), for
machines the model cannot be carried to; the cost per token depends on the shape, not the weights,
but lengths do (random weights rarely stop early).
"""

from __future__ import annotations

import argparse
import time

import torch

from rollwise.engine import GenerationRequest
from rollwise.engine.continuous import ContinuousEngine

G = 8  # samples per prompt
MAX_NEW = 48  # the default job's max_completion_length
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# SmolLM2-135M-Instruct's shape (its config.json)
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                    rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def real_model(prompts: int, seed: int) -> tuple[torch.nn.Module, list[list[int]], int, int]:
    from rollwise.config import load_config
    from rollwise.data import build_items, encode_prompts
    from rollwise.models import load_model, load_tokenizer, resolve_model_path

    cfg = load_config(None, [f"data.train_size={prompts}", "data.eval_size=8", f"run.seed={seed}"])
    path = resolve_model_path(cfg.model.name_or_path, None)
    tok = load_tokenizer(path)
    items, _ = build_items(cfg.data, seed)
    ids, _ = encode_prompts(items, tok, cfg.data)
    return load_model(path, torch.float32), ids, tok.eos_token_id, tok.pad_token_id


def random_model(prompts: int, seed: int) -> tuple[torch.nn.Module, list[list[int]], int, int]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).eval()
    ids = torch.randint(3, SMOLLM2_135M["vocab_size"], (prompts, 60)).tolist()  # about the mixture's prompt length
    return model, ids, SMOLLM2_135M["eos_token_id"], SMOLLM2_135M["pad_token_id"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=list(DTYPES), default="float32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--random-init", action="store_true", help="a random model of SmolLM2-135M's shape, random prompts")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, ids, eos, pad = (random_model if args.random_init else real_model)(args.prompts, args.seed)
    model = model.to(args.device)
    n = args.prompts * G
    engine = ContinuousEngine(model, [eos], pad, DTYPES[args.dtype], n, seed=args.seed, num_slots=n, record_topk=32)
    reqs = [GenerationRequest(ids[p], MAX_NEW, 1.0) for p in range(args.prompts) for _ in range(G)]

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    engine.generate(reqs[:G])  # warm-up
    t0 = time.perf_counter()
    outs = engine.generate(reqs)
    sync()
    gen_s = time.perf_counter() - t0
    tokens = sum(len(o.response_ids) for o in outs)
    before = dict(engine.stats)
    t0 = time.perf_counter()
    engine.verify([r.prompt_ids for r in reqs], outs, 1.0, 1.0, MAX_NEW)
    sync()
    ver_s = time.perf_counter() - t0
    accepted = engine.stats["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    r = gen_s / ver_s
    what = f"{'random-init ' if args.random_init else ''}{args.dtype} on {args.device}"
    print(f"{what}, {args.threads} threads, {n} responses, {tokens} tokens")
    print(f"| pass | seconds | tokens/s |\n|---|---|---|\n| generate | {gen_s:.2f} | {tokens / gen_s:.0f} |\n"
          f"| verify (same weights, {accepted:.0f} of {tokens} accepted) | {ver_s:.2f} | {tokens / ver_s:.0f} |")
    print(f"verification is {r:.2f}x faster per token than generation")
    for a in (0.45, 0.55, 0.66, 0.9):
        print(f"acceptance {a:.2f}: reuse costs at least {1 / r + 1 - a:.2f} of plain generation; halving it needs "
              f"verification {1 / max(a - 0.5, 1e-9):.1f}x faster" if a > 0.5 else
              f"acceptance {a:.2f}: reuse costs at least {1 / r + 1 - a:.2f} of plain generation; it cannot halve")


if __name__ == "__main__":
    main()
