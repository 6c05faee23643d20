import torch

from rollwise.config import load_config
from rollwise.models import load_model
from rollwise.training.policy import PolicyTrainer, lr_lambda
from rollwise.types import Sample


def _samples(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    # group a: mixed rewards; group b: all equal (advantage exactly 0); group c: singleton
    for uid, rewards in (("a", [1.0, 0.0, 0.0, 1.0]), ("b", [1.0, 1.0, 1.0]), ("c", [0.0])):
        for r in rewards:
            plen = int(torch.randint(2, 6, (1,), generator=g))
            rlen = int(torch.randint(1, 7, (1,), generator=g))
            p = torch.randint(4, 90, (plen,), generator=g).tolist()
            resp = torch.randint(4, 90, (rlen,), generator=g).tolist()
            out.append(Sample(uid, 0, p, resp, [0.0] * rlen, [0] * rlen, "stop", reward=r))
    return out


def _grads(model_dir, overrides):
    cfg = load_config(None, ["model.dtype=float32", "train.micro_batch_size=2", *overrides])
    torch.manual_seed(0)
    model = load_model(str(model_dir))
    tr = PolicyTrainer(cfg, model, pad_id=0)
    captured = []
    tr.optimizer.step = lambda: captured.append({n: p.grad.clone() for n, p in model.named_parameters()})
    samples = _samples()
    tr.compute_advantages(samples)
    m = tr.update(samples)
    return captured[0], m, samples


def test_zero_advantage_samples_are_skipped_with_identical_gradient(tiny_model_dir):
    for loss_type in ("dapo", "grpo", "dr_grpo"):
        for policy_loss in ("ppo_clip", "gspo", "cispo"):
            ov = [f"algo.loss_type={loss_type}", f"algo.policy_loss={policy_loss}"]
            g_skip, m_skip, samples = _grads(tiny_model_dir, ov + ["train.skip_zero_advantage=true"])
            g_all, m_all, _ = _grads(tiny_model_dir, ov + ["train.skip_zero_advantage=false"])
            assert m_skip["train/skipped_zero_adv"] == 4  # 3 in the all-equal group + the singleton
            assert m_all["train/skipped_zero_adv"] == 0
            assert [s.advantage for s in samples if s.prompt_uid != "a"] == [0.0] * 4
            for n in g_all:
                torch.testing.assert_close(g_skip[n], g_all[n], atol=1e-6, rtol=1e-4, msg=f"{loss_type}/{policy_loss} {n}")
            torch.testing.assert_close(torch.tensor(m_skip["loss/policy"]), torch.tensor(m_all["loss/policy"]))
            assert any(g.abs().sum() > 0 for g in g_skip.values())


def test_beta_forces_every_sample_through(tiny_model_dir):
    _, m, _ = _grads(tiny_model_dir, ["algo.beta=0.1"])
    assert m["train/skipped_zero_adv"] == 0 and m["loss/kl"] >= 0


def test_mask_truncated_completions_excludes_them(tiny_model_dir):
    cfg = load_config(None, ["model.dtype=float32", "algo.mask_truncated_completions=true"])
    model = load_model(str(tiny_model_dir))
    tr = PolicyTrainer(cfg, model, pad_id=0)
    samples = _samples()
    for s in samples:
        s.finish_reason = "length"
    tr.compute_advantages(samples)
    m = tr.update(samples)
    assert m["train/forwarded_sequences"] == 0


def test_lr_schedule():
    f = lr_lambda(2, 10, "linear")
    assert [round(f(i), 3) for i in (0, 1, 2, 6, 10)] == [0.5, 1.0, 1.0, 0.5, 0.0]
    c = lr_lambda(0, 10, "cosine")
    assert abs(c(5) - 0.5) < 1e-9 and abs(c(0) - 1.0) < 1e-9
    assert lr_lambda(0, 10, "constant")(7) == 1.0
