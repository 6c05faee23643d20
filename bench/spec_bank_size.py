"""What speculative reuse's bank costs per banked token, in memory and in a checkpoint. A tiny random model.

    .venv/bin/python bench/spec_bank_size.py        # seconds

A 2-layer Llama (vocab 100, hidden 64, random weights, no download) generates 8 responses of 64 tokens
(EOS never stops them) for each of 64 prompts with `spec_topk=32`, the default, into the executor's
bank. Printed, per banked token: the bytes of tensor storage the bank's top-k keeps alive (a view keeps
its whole storage), the tensor objects it holds (each costs a few hundred bytes of bookkeeping), and the
size of `torch.save(executor.state_dict())`, with the top-k and without it. (The process's resident
memory is no measure here: the allocator reuses what the warm-up step freed.)
"""

from __future__ import annotations

import gc
import io
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from rollwise.engine.continuous import ContinuousEngine  # noqa: E402
from rollwise.engine.executor import RolloutExecutor  # noqa: E402
from rollwise.planner.base import Request  # noqa: E402


def tiny_llama(vocab: int, hidden: int) -> LlamaForCausalLM:
    """A 2-layer Llama with random weights (seeded by the caller): pad 0, EOS 1, BOS 2."""
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    return LlamaForCausalLM(cfg).eval()


def topk_tensors(topk) -> list[torch.Tensor]:
    return list(topk) if isinstance(topk, tuple) else [t for pair in topk for t in pair]


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_llama(vocab=100, hidden=64)
    eng = ContinuousEngine(model, [], 0, dtype=torch.float32, batch_size=16, num_slots=16, seed=0, record_topk=32)
    prompts = {f"p{i}": [2, 3, 4 + i % 50] for i in range(64)}
    RolloutExecutor(eng, prompts, 64, 1.0).generate([Request(u, 8) for u in prompts])  # warm-up, not banked
    ex = RolloutExecutor(eng, prompts, 64, 1.0, speculative=True)
    ex.generate([Request(u, 8) for u in prompts], first_round=True)
    gc.collect()
    tokens = sum(len(o.response_ids) for v in ex.bank.values() for o in v)
    tensors = [t for v in ex.bank.values() for o in v for t in topk_tensors(o.topk)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    buf = io.BytesIO()
    torch.save(ex.state_dict(), buf)
    bare = {u: [type(o)(**{**o.__dict__, "topk": []}) for o in v] for u, v in ex.bank.items()}
    buf2 = io.BytesIO()
    torch.save({"bank": bare}, buf2)
    print(f"{len(ex.bank)} prompts, {tokens:,} banked tokens, spec_topk 32")
    print(f"top-k storage kept alive: {sum(storages.values()) / tokens:,.0f} bytes per banked token; "
          f"tensor objects: {len(tensors) / tokens:.3f} per banked token")
    print(f"checkpoint: {buf.tell() / tokens:,.0f} bytes per banked token ({buf2.tell() / tokens:,.0f} without the top-k)")


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        sys.exit(0)
    main()
