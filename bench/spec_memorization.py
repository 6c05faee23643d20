"""Why speculative reuse drifts: after one update, verification keeps the responses it was trained on.

    .venv/bin/python bench/spec_memorization.py                 # seed 0, lr 3e-5, ~3 min on 1 core
    .venv/bin/python bench/spec_memorization.py --seed 1

The exactness of speculative reuse at lenience 1 assumes that the old response is a draw from
the old policy *independent of the new weights*. In RL post-training it is not: the new weights
were trained on that very response. This script measures how much that matters.

SmolLM2-135M-Instruct (fp32) samples `--prompts` default-mixture prompts x 8 ("trained"), and
the same again ("control", never trained on). One GRPO update (AdamW, `--lr`, token-sum loss over
the batch, grad clip 1) is taken on the trained groups. Then every response is scored under the
new weights: P(full reuse) = prod_i min(1, p_new(y_i) / p_old(y_i)) is the probability that
verification keeps it whole. If the new weights did not depend on the responses, trained and
control responses with the same reward would be kept equally often.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from rollwise.config import load_config
from rollwise.data import build_items, encode_prompts
from rollwise.engine import GenerationOutput, GenerationRequest
from rollwise.engine.continuous import ContinuousEngine
from rollwise.models import load_model, load_tokenizer, resolve_model_path
from rollwise.rewards.verifiers import prepare_reasoning_gym, reasoning_gym

G = 8  # samples per prompt


def token_logprobs(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    x = torch.tensor([prompt + response])
    logits = model(x).logits[0, len(prompt) - 1:-1].float()  # [L, V]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None]).squeeze(1)  # [L]


def keep_whole(model: torch.nn.Module, prompt: list[int], o: GenerationOutput) -> tuple[float, float]:
    """P(verification keeps the response whole) and the mean per-token log-prob change."""
    with torch.no_grad():
        d = token_logprobs(model, prompt, o.response_ids).double() - torch.tensor(o.logprobs, dtype=torch.float64)
    return float(d.clamp(max=0).sum().exp()), float(d.mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = load_config(None, [f"data.train_size={args.prompts}", "data.eval_size=8", f"run.seed={args.seed}"])
    path = resolve_model_path(cfg.model.name_or_path, None)
    tok = load_tokenizer(path)
    model = load_model(path, torch.float32)
    items, _ = build_items(cfg.data, args.seed)
    prepare_reasoning_gym(items)
    ids, _ = encode_prompts(items, tok, cfg.data)
    gen_eos = model.generation_config.eos_token_id
    eos = sorted({tok.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])} - {None})
    engine = ContinuousEngine(model, eos, tok.pad_token_id, torch.float32, 64, seed=args.seed, num_slots=64)
    reqs = [GenerationRequest(ids[p], cfg.rollout.max_completion_length, 1.0) for p in range(args.prompts)
            for _ in range(G)]
    trained, control = engine.generate(reqs), engine.generate(reqs)

    def rewards(outs: list[GenerationOutput]) -> torch.Tensor:
        return torch.tensor([reasoning_gym(tok.decode(o.response_ids, skip_special_tokens=True), items[j // G])
                             for j, o in enumerate(outs)])

    r, rc = rewards(trained), rewards(control)
    adv = torch.zeros_like(r)
    for p in range(args.prompts):
        g = r[p * G:(p + 1) * G]
        if g.std() > 0:
            adv[p * G:(p + 1) * G] = (g - g.mean()) / (g.std() + 1e-4)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    total = sum(len(o.response_ids) for o in trained)
    model.train()
    for j, o in enumerate(trained):
        if adv[j] != 0:
            (-(adv[j] * token_logprobs(model, reqs[j].prompt_ids, o.response_ids).sum()) / total).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    model.eval()

    rows: dict[str, list[tuple[float, float]]] = {}
    for j, o in enumerate(trained):
        kind = "advantage > 0" if adv[j] > 0 else "advantage < 0" if adv[j] < 0 else "advantage = 0"
        rows.setdefault(f"trained, {kind}", []).append(keep_whole(model, reqs[j].prompt_ids, o))
    for j, o in enumerate(control):
        rows.setdefault(f"control, reward {'1' if rc[j] > 0.5 else '0'}", []).append(
            keep_whole(model, reqs[j].prompt_ids, o))
    print(f"seed {args.seed}, lr {args.lr:g}, {args.prompts} prompts x {G}: one update, then verification")
    print("| responses | n | P(kept whole) | mean log-prob change per token |\n|---|---|---|---|")
    for k in sorted(rows):
        v = rows[k]
        print(f"| {k} | {len(v)} | {statistics.mean(a for a, _ in v):.2f} | {statistics.mean(d for _, d in v):+.3f} |")


if __name__ == "__main__":
    main()
