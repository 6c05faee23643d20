"""Trainer plumbing checks against hand-computed references: the log-probs of models that rescale their
logits, and float16 training's loss scaling."""

import pytest
import torch
import transformers

from rollwise.config import load_config
from rollwise.models import load_model
from rollwise.training.logprobs import pack, response_logprobs
from rollwise.training.policy import PolicyTrainer
from rollwise.types import Sample


def _direct_logprobs(model, prompts, responses, temperature):
    """log softmax(model(prompt + response).logits / T) at the position before each response token."""
    out = []
    with torch.no_grad():
        for p, r in zip(prompts, responses):
            logits = model(torch.tensor([p + r])).logits[0].float() / temperature  # [P + R, V]
            ls = torch.log_softmax(logits, dim=-1)
            out.append(torch.stack([ls[len(p) - 1 + t, r[t]] for t in range(len(r))]))
    return out


@pytest.mark.parametrize("arch,extra", [
    ("HyperCLOVAX", {"logits_scaling": 4.0}),  # multiplies its logits by logits_scaling (Granite divides)
    ("FalconH1", {"lm_head_multiplier": 0.25}),  # multiplies its logits by lm_head_multiplier
])
def test_logprobs_apply_the_models_own_logit_scaling(arch, extra):
    cfg_cls = getattr(transformers, f"{arch}Config", None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {arch}")
    torch.manual_seed(0)
    cfg = cfg_cls(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, pad_token_id=0, eos_token_id=1, bos_token_id=2, **extra)
    model = getattr(transformers, f"{arch}ForCausalLM")(cfg).eval()
    prompts, responses = [[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]]  # left padding on the second
    with torch.no_grad():
        lp, _ = response_logprobs(model, pack(prompts, responses, 0), 0.8)
    for b, ref in enumerate(_direct_logprobs(model, prompts, responses, 0.8)):
        torch.testing.assert_close(lp[b, : len(responses[b])], ref, atol=1e-5, rtol=1e-5)


def _samples():
    g = torch.Generator().manual_seed(0)
    out = []
    for uid, rewards in (("a", [1.0, 0.0, 0.0, 1.0]), ("b", [1.0, 0.5, 0.0]), ("c", [0.0, 1.0])):
        for r in rewards:
            p = torch.randint(4, 90, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
            n = int(torch.randint(1, 9, (1,), generator=g))
            out.append(Sample(uid, 0, p, torch.randint(4, 90, (n,), generator=g).tolist(), [-4.6] * n, [0] * n,
                              "stop", reward=r))
    return out


def _fp16_trainer(model_dir, dtype):
    cfg = load_config(None, [f"model.dtype={dtype}", "algo.loss_type=dr_grpo", "rollout.max_completion_length=32768",
                             "train.warmup_steps=0", "train.max_grad_norm=1e9", "train.learning_rate=1e-6"])
    torch.manual_seed(0)
    model = load_model(str(model_dir))
    return PolicyTrainer(cfg, model, pad_id=0), model


def test_float16_training_scales_the_loss_so_small_gradients_do_not_flush_to_zero(tiny_model_dir):
    """dr_grpo divides by sequences x max_completion_length: unscaled, a quarter of the float16 gradient's
    entries came out exactly 0 and it was 46% off the float32 one (bfloat16: 0.6%)."""
    grads = {}
    for dtype in ("float32", "float16"):
        tr, model = _fp16_trainer(model_dir=tiny_model_dir, dtype=dtype)
        got = []
        step = tr.optimizer.step
        tr.optimizer.step = lambda m=model, got=got, step=step: (
            got.append({n: p.grad.clone() for n, p in m.named_parameters()}), step())
        samples = _samples()
        tr.compute_advantages(samples)
        tr.update(samples)
        grads[dtype] = got[0]
    ref, half = grads["float32"], grads["float16"]
    err = sum(float((half[n] - ref[n]).norm() ** 2) for n in ref) ** 0.5 / sum(float(g.norm() ** 2) for g in ref.values()) ** 0.5
    zeros = sum(int(((half[n] == 0) & (ref[n] != 0)).sum()) for n in ref)
    entries = sum(g.numel() for g in ref.values())
    # an entry may still round to 0 in float16 (one did on one CPU); unscaled, a quarter of them did
    assert err < 0.02 and zeros <= entries * 1e-4, (err, zeros, entries)


def test_a_float16_update_that_overflows_is_skipped_at_a_lower_scale_not_refused(tiny_model_dir):
    tr, model = _fp16_trainer(tiny_model_dir, "float16")
    tr.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 100)  # every scaled gradient overflows float16
    samples = _samples()
    tr.compute_advantages(samples)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = tr.update(samples)  # no TrainingDivergedError: the overflow is the scale's, not the policy's
    assert out["train/fp16_skipped_updates"] == 1.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert tr.scaler.get_scale() == 2.0 ** 99 and tr.scheduler.last_epoch == 0
    again, _ = _fp16_trainer(tiny_model_dir, "float16")
    again.load_state_dict(tr.state_dict())  # the scale travels in checkpoints
    assert again.scaler.get_scale() == 2.0 ** 99


@pytest.mark.parametrize("arch,extra", [
    ("Llama", {"attention_dropout": 0.5}),  # a float the attention function reads while training
    ("GPT2", {"resid_pdrop": 0.5, "embd_pdrop": 0.5, "attn_pdrop": 0.5}),  # nn.Dropout modules
])
def test_disable_dropout_makes_the_update_forward_deterministic(arch, extra):
    """train.disable_dropout (TRL's name) did not exist: a model with dropout trained with it on while the engine
    and the reference model ran without it, so the update's log-probs carried noise the sampled ones did not."""
    torch.manual_seed(0)
    common = {"vocab_size": 100, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    if arch == "GPT2":
        mcfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=64, **common, **extra)
    else:
        mcfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, **common, **extra)
    batch = pack([[5, 6, 7]], [[10, 11, 12, 13]], 0)

    def two_forwards(on: bool):
        model = getattr(transformers, f"{arch}LMHeadModel" if arch == "GPT2" else f"{arch}ForCausalLM")(mcfg)
        if arch == "Llama":
            model.config._attn_implementation = "eager"  # eager attention applies attention_dropout itself
        cfg = load_config(None, [f"train.disable_dropout={str(on).lower()}"])
        tr = PolicyTrainer(cfg, model, pad_id=0)
        tr.model.train()
        with torch.no_grad():
            return [response_logprobs(tr.model, batch, 1.0)[0] for _ in range(2)]

    a, b = two_forwards(False)
    assert not torch.equal(a, b)  # dropout is on in training (TRL's default)
    a, b = two_forwards(True)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_disable_dropout_keeps_the_lora_adapters_own_dropout():
    from rollwise.models import disable_dropout

    model = torch.nn.ModuleDict({"attn": torch.nn.Dropout(0.3), "lora_dropout": torch.nn.ModuleDict(
        {"default": torch.nn.Dropout(0.2)})})
    assert disable_dropout(model) == 1
    assert model["attn"].p == 0.0 and model["lora_dropout"]["default"].p == 0.2
