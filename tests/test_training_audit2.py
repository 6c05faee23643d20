"""Audit of the policy update, log-probs, checkpoints and model loading: each test failed before its fix."""

from __future__ import annotations

import torch
import transformers
from torch.testing import assert_close

from rollwise.config import load_config
from rollwise.models import apply_lora
from rollwise.training.logprobs import pack, response_logprobs
from rollwise.training.policy import PolicyTrainer
from rollwise.types import Sample

SMALL = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
RESPONSES = [[20, 21, 22], [25, 26, 27, 28], [30, 31]]


def _direct_logprobs(model, prompts, responses, temperature=1.0):
    """log softmax(model(prompt + response).logits / T) before each response token, one sequence at a time."""
    out = []
    with torch.no_grad():
        for p, r in zip(prompts, responses):
            ls = torch.log_softmax(model(input_ids=torch.tensor([p + r])).logits[0].float() / temperature, dim=-1)
            out.append(torch.stack([ls[len(p) - 1 + t, r[t]] for t in range(len(r))]))
    return out


def _untied_lora_on_lm_head():
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL, tie_word_embeddings=False))
    cfg = load_config(None, ["model.dtype=float32", "model.lora.enabled=true", "model.lora.r=4",
                             "model.lora.target_modules=[q_proj, lm_head]"])
    lora = apply_lora(model, cfg.model)
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # B starts at 0: make the adapters matter
    return lora


def test_logprobs_of_a_lora_adapted_lm_head_include_the_adapter():
    """An untied model may adapt lm_head (apply_lora refuses it only where it is tied). The log-probs
    read `head.weight`, which on peft's wrapper is the frozen base's: the adapter was left out, so the
    trainer scored another model than the engine (which runs the merged weights) and lm_head's adapter
    never got a gradient."""
    lora = _untied_lora_on_lm_head().eval()
    with torch.no_grad():
        lp, _ = response_logprobs(lora, pack(PROMPTS, RESPONSES, 0), 0.8, chunk_tokens=2)
    for b, ref in enumerate(_direct_logprobs(lora, PROMPTS, RESPONSES, 0.8)):
        assert_close(lp[b, : len(RESPONSES[b])], ref, atol=1e-5, rtol=1e-5)
    # the update reaches the head's adapter
    cfg = load_config(None, ["model.dtype=float32", "model.lora.enabled=true", "train.max_grad_norm=1e9"])
    tr = PolicyTrainer(cfg, lora, pad_id=0)
    grads = []
    tr.optimizer.step = lambda: grads.append({n: p.grad for n, p in lora.named_parameters() if p.requires_grad})
    samples = [Sample("a", 0, p, r, [0.0] * len(r), [0] * len(r), "stop", reward=float(i % 2))
               for i, (p, r) in enumerate(zip(PROMPTS * 2, RESPONSES * 2))]
    tr.compute_advantages(samples)
    tr.update(samples)
    head = [n for n in grads[0] if "lm_head" in n and "lora_A" in n]
    assert head and all(grads[0][n] is not None and grads[0][n].abs().sum() > 0 for n in head)


def test_auto_dtype_on_a_gpu_that_only_emulates_bf16_is_float32(monkeypatch):
    """`model.dtype=auto` means bf16 where the device computes it natively. torch.cuda.is_bf16_supported()
    also says yes on a T4 or V100 (compute capability 7.x), where bf16 is emulated: the trainer ran slowly in
    emulated bf16 there, and vLLM refuses bf16 on those GPUs outright."""
    from rollwise.models import compute_dtype, native_bf16

    class Props:
        major, minor = 7, 5

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: Props())
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda *a: True, raising=False)
    assert not native_bf16("cuda")
    assert compute_dtype("auto", "cuda") == torch.float32
    Props.major = 8  # Ampere and later compute bf16 natively
    assert native_bf16("cuda") and compute_dtype("auto", "cuda") == torch.bfloat16


def test_disable_dropout_also_covers_rates_models_read_from_their_config():
    """Falcon adds its hidden dropout with `config.hidden_dropout` and Persimmon's attention reads
    `config.attention_dropout` while training: with train.disable_dropout on (the default) their update
    forwards still drew dropout masks, so the log-probs carried noise the engine's and the reference's did not."""
    batch = pack([[5, 6, 7]], [[10, 11, 12, 13]], 0)
    for cls, mcfg in (
        (transformers.FalconForCausalLM, transformers.FalconConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, vocab_size=100, hidden_dropout=0.5,
            attention_dropout=0.5)),
        (transformers.PersimmonForCausalLM, transformers.PersimmonConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=100,
            attention_dropout=0.5, hidden_dropout=0.5)),
    ):
        torch.manual_seed(0)
        tr = PolicyTrainer(load_config(None, ["train.disable_dropout=true"]), cls(mcfg), pad_id=0)
        tr.model.train()
        with torch.no_grad():
            a, b = (response_logprobs(tr.model, batch, 1.0)[0] for _ in range(2))
        assert_close(a, b, atol=0, rtol=0, msg=cls.__name__)


def test_lora_runs_print_no_transformers_deprecation_noise(tiny_model_dir):
    """Every LoRA train or export printed transformers 5's FutureWarning about `is_gradient_checkpointing` (peft
    reads the old name)."""
    import warnings

    from rollwise.config import load_config
    from rollwise.models import apply_lora, load_model

    cfg = load_config(None, [f"model.name_or_path={tiny_model_dir}", "model.lora.enabled=true"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_lora(load_model(str(tiny_model_dir)), cfg.model)
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
