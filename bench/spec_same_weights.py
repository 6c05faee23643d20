"""Speculative reuse under unchanged weights: how many old tokens does verification accept?

    .venv/bin/python bench/spec_same_weights.py            # the engine in bf16 (default)
    .venv/bin/python bench/spec_same_weights.py float32

With the weights unchanged the exact rule should accept every token. 64 responses of
SmolLM2-135M-Instruct to 8 default-mixture prompts are generated, then verified.
"""
import statistics
import sys

import torch

from rollwise.config import load_config
from rollwise.data import build_items, encode_prompts
from rollwise.engine import GenerationOutput, GenerationRequest
from rollwise.engine.continuous import ContinuousEngine
from rollwise.loop import set_threads
from rollwise.models import load_model, load_tokenizer, resolve_model_path


def mean_len(xs) -> float:
    return statistics.mean(len(o.response_ids) for o in xs)


def main() -> None:
    set_threads(2)
    name = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
    if name not in ("bfloat16", "float32", "float16"):
        print(f"spec_same_weights.py: unknown engine dtype {name!r}; give bfloat16 (default), float32 or float16",
              file=sys.stderr)
        sys.exit(2)
    dtype = getattr(torch, name)
    cfg = load_config(None, ["data.train_size=16", "data.eval_size=8"])
    path = resolve_model_path("smollm2-135m", None)
    tok = load_tokenizer(path)
    model = load_model(path, torch.float32)
    items, _ = build_items(cfg.data, 0)
    ids, _ = encode_prompts(items, tok, cfg.data)
    gen_eos = model.generation_config.eos_token_id
    eos = sorted({tok.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])} - {None})
    eng = ContinuousEngine(model, eos, tok.pad_token_id, dtype, 64, seed=0, num_slots=64, record_topk=32)
    reqs = [GenerationRequest(p, 48, 1.0) for p in ids[:8] for _ in range(8)]
    olds = eng.generate(reqs)
    fresh = eng.generate(reqs)
    verified = eng.verify([r.prompt_ids for r in reqs], olds, 1.0, 1.0, 48)
    done = [i for i in verified if isinstance(i, GenerationOutput)]
    cont = [i for i in verified if not isinstance(i, GenerationOutput)]
    outs = done + eng.generate(cont)
    st = eng.stats
    print(f"{dtype}: same weights, acceptance {st['spec_accepted_tokens'] / st['spec_old_tokens']:.0%}, "
          f"{len(done)} fully reused, {len(cont)} continued")
    print(f"mean length: old {mean_len(olds):.1f}, fresh {mean_len(fresh):.1f}, reused {mean_len(outs):.1f}")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    main()
