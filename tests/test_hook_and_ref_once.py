"""Two narrow behaviours.

1. rollwise's hook on threading.excepthook (it leaves out the traceback TensorBoard's writer thread prints on a full
   disk) leaves out only the writer threads of rollwise's own Tracker: a user's threads and their own SummaryWriter
   still reach the hook that was there before, and that hook is back once the Tracker closes, whichever way the run
   ended, also with several Trackers open in one process (a notebook).
2. The KL reference's log-probs (the LoRA base model with its adapters off, or the eval-mode copy) are taken once per
   micro-batch and reused by the algo.num_iterations passes: one reference forward instead of one per pass, and the
   same losses, gradients and weights, bit for bit, as taking them again at every pass.
"""

from __future__ import annotations

import errno
import threading
from types import SimpleNamespace

import pytest
import torch

from rollwise import tracking
from rollwise.tracking import StorageError, Tracker


# ---------------------------------------------------------------------------------------------- 1. the thread hook
@pytest.fixture
def recorder(monkeypatch):
    """The hook in place before rollwise's (a user's, a notebook's): it records what reaches it. rollwise's module
    state starts empty here whatever earlier tests in this process left open."""
    monkeypatch.setattr(tracking, "_quiet_threads", set(), raising=False)
    monkeypatch.setattr(tracking, "_installed_hook", None, raising=False)
    seen: list[threading.ExceptHookArgs] = []

    def hook(args):
        seen.append(args)

    monkeypatch.setattr(threading, "excepthook", hook)
    hook.seen = seen
    return hook


def _fail_in_thread(exc: BaseException, cls: type[threading.Thread] = threading.Thread) -> threading.Thread:
    def boom():
        raise exc

    t = cls(target=boom)
    t.start()
    t.join(timeout=10)
    return t


def _worker(tracker: Tracker) -> threading.Thread:
    return tracker.writer._get_file_writer().event_writer._async_writer._worker


def _fill_disk(writer) -> None:
    """The event file's writes fail as on a full disk."""
    def full(data):
        raise OSError(errno.ENOSPC, "No space left on device")

    writer._get_file_writer().event_writer._async_writer._writer.write = full


def _full_disk(tracker: Tracker) -> threading.Thread:
    """A full disk under `tracker`'s writer thread: `log` says so as a StorageError; the thread ends with its OSError."""
    _fill_disk(tracker.writer)
    worker = _worker(tracker)
    with pytest.raises(StorageError, match="No space left on device"):
        tracker.log(1, {"x": 1.0})
    worker.join(timeout=10)
    assert not worker.is_alive()
    return worker


def test_other_threads_errors_reach_the_previous_hook_while_a_tracker_is_open(tmp_path, recorder):
    t = Tracker(tmp_path, tensorboard=True)
    assert threading.excepthook is not recorder  # rollwise's hook is on
    try:
        # a user's own thread failing with an OSError (a file of theirs, a socket)
        mine = _fail_in_thread(OSError(errno.EIO, "my own I/O error"))

        # a user's own TensorBoard writer in the same process, on a full disk: its thread is theirs, not rollwise's
        from torch.utils.tensorboard import SummaryWriter

        theirs = SummaryWriter(str(tmp_path / "their_tb"))
        their_worker = theirs._get_file_writer().event_writer._async_writer._worker
        _fill_disk(theirs)
        with pytest.raises(OSError):
            theirs.add_scalar("x", 1.0, 1)
            theirs.flush()
        their_worker.join(timeout=10)

        # and a thread of theirs whose class only shares the name of TensorBoard's
        class _AsyncWriterThread(threading.Thread):
            pass

        lookalike = _fail_in_thread(OSError(errno.ENOSPC, "No space left on device"), _AsyncWriterThread)
        # any error of another type, from any thread, as before
        other = _fail_in_thread(ValueError("a bug"))
    finally:
        t.close()
    assert [a.thread for a in recorder.seen] == [mine, their_worker, lookalike, other]
    assert threading.excepthook is recorder  # and the hook is back once the tracker closed


def test_the_trackers_own_writer_thread_is_left_out_and_the_hook_back_after_close(tmp_path, recorder, capsys):
    """The full-disk path: one message (the StorageError), no traceback of the writer thread; the previous hook is
    back after close, though close raises the writer's error again (SummaryWriter.close flushes first; the loop's
    close_on_failure ignores it), and stays back on a second close."""
    t = Tracker(tmp_path, tensorboard=True)
    _full_disk(t)
    assert recorder.seen == []
    for _ in range(2):
        with pytest.raises(OSError):
            t.close()
        assert threading.excepthook is recorder
    assert "Traceback" not in capsys.readouterr().err
    ok = Tracker(tmp_path / "ok", tensorboard=True)
    ok.log(1, {"x": 1.0})
    ok.close()
    ok.close()  # twice: harmless
    assert threading.excepthook is recorder and recorder.seen == []


def test_a_non_oserror_of_the_trackers_own_writer_still_prints(tmp_path, recorder):
    t = Tracker(tmp_path, tensorboard=True)

    def bug(data):
        raise ValueError("a bug in the writer")

    t.writer._get_file_writer().event_writer._async_writer._writer.write = bug
    worker = _worker(t)
    with pytest.raises(ValueError):
        t.log(1, {"x": 1.0})
    worker.join(timeout=10)
    with pytest.raises(ValueError):
        t.close()
    assert [a.thread for a in recorder.seen] == [worker] and isinstance(recorder.seen[0].exc_value, ValueError)
    assert threading.excepthook is recorder


@pytest.mark.parametrize("order", ["inner_first", "outer_first"])
def test_several_trackers_in_one_process(tmp_path, recorder, order):
    """Each tracker's writer thread is left out while it lives; the previous hook is back when the last one closes,
    whichever closes first; a tracker opened after that sets the hook again."""
    a = Tracker(tmp_path / "a", tensorboard=True)
    b = Tracker(tmp_path / "b", tensorboard=True)
    hook = threading.excepthook
    assert hook is not recorder
    first, second = (b, a) if order == "inner_first" else (a, b)
    first.close()
    assert threading.excepthook is hook  # the other one's thread still needs it
    _full_disk(second)  # still left out
    assert recorder.seen == []
    mine = _fail_in_thread(OSError(errno.EIO, "mine"))
    assert [x.thread for x in recorder.seen] == [mine]
    with pytest.raises(OSError):
        second.close()
    assert threading.excepthook is recorder
    c = Tracker(tmp_path / "c", tensorboard=True)
    assert threading.excepthook is not recorder
    _full_disk(c)
    assert [x.thread for x in recorder.seen] == [mine]
    with pytest.raises(OSError):
        c.close()
    assert threading.excepthook is recorder
    assert tracking._quiet_threads == set()


def test_a_hook_set_over_rollwises_is_left_in_place(tmp_path, recorder):
    """A hook the user set after the tracker opened (wrapping rollwise's) is not replaced when the tracker closes;
    rollwise's, then inside it, lets every error through."""
    t = Tracker(tmp_path, tensorboard=True)
    ours = threading.excepthook

    def theirs(args):
        ours(args)

    threading.excepthook = theirs
    t.close()
    assert threading.excepthook is theirs
    mine = _fail_in_thread(OSError(errno.EIO, "mine"))
    assert [x.thread for x in recorder.seen] == [mine]


def test_without_tensorboard_no_hook_is_set(tmp_path, recorder):
    t = Tracker(tmp_path, tensorboard=False)
    assert threading.excepthook is recorder
    t.close()
    assert threading.excepthook is recorder


def _fake_run(tmp_path):
    closed = []
    runner = SimpleNamespace(close=lambda: closed.append("runner"))
    run = SimpleNamespace(tracker=Tracker(tmp_path, tensorboard=True), runner=runner, progress=None, start_step=0,
                          run_dir=tmp_path, result=SimpleNamespace(eval_after=None), cfg=None, totals={"tokens": 0})
    return run, closed


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_run_stopped_by_ctrl_c_or_an_error_puts_the_hook_back(tmp_path, recorder, stop):
    """close_on_failure (the sync and async loops' path for Ctrl-C and errors) closes the tracker: the hook is back."""
    from rollwise import loop

    run, closed = _fake_run(tmp_path)
    assert threading.excepthook is not recorder
    with pytest.raises(stop):
        try:
            raise stop()
        except BaseException:
            loop.close_on_failure(run)
            raise
    assert threading.excepthook is recorder and closed == ["runner"]


def test_a_finish_stopped_by_its_final_evaluation_puts_the_hook_back(tmp_path, recorder, monkeypatch):
    """The async loop calls `finish` after its own clean-up: Ctrl-C in the final evaluation there left the tracker
    (its writer thread, rollwise's hook) and the reward worker open."""
    from rollwise import loop

    run, closed = _fake_run(tmp_path)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "final_eval_due", lambda run, last_step: True)
    monkeypatch.setattr(loop, "final_eval", interrupted)
    with pytest.raises(KeyboardInterrupt):
        loop.finish(run, 0, quiet=True)
    assert threading.excepthook is recorder and closed == ["runner"]


def test_a_finished_run_puts_the_hook_back(tmp_path, recorder, monkeypatch):
    from rollwise import loop

    run, closed = _fake_run(tmp_path)
    monkeypatch.setattr(loop, "final_eval_due", lambda run, last_step: False)
    loop.finish(run, 0, quiet=True)
    assert threading.excepthook is recorder and closed == ["runner"]


# ------------------------------------------------------------------------------ 2. the KL reference, once a batch
ITERS = 3


def _samples():
    from rollwise.types import Sample

    g = torch.Generator().manual_seed(0)
    out = []
    for uid, rewards in (("a", [1.0, 0.0, 0.0, 1.0]), ("b", [1.0, 0.0, 1.0])):
        for r in rewards:
            p = torch.randint(4, 90, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
            resp = torch.randint(4, 90, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
            out.append(Sample(uid, 0, p, resp, [0.0] * len(resp), [0] * len(resp), "stop", reward=r))
    return out


def _decoder(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder() or base.model


def _update(model_dir, lora: bool, monkeypatch, recompute_every_pass: bool):
    """One update of algo.num_iterations=ITERS passes with a KL term; returns the gradient of every pass, the
    metrics, the weights after, and the decoder forwards of the policy and of the reference.

    `recompute_every_pass`: what rollwise did before, the reference's log-probs taken again at every pass (the KL
    term is given fresh ones, checked equal to those the update holds)."""
    from rollwise.config import load_config
    from rollwise.models import apply_lora, load_model
    from rollwise.training import policy as policy_mod
    from rollwise.training.policy import PolicyTrainer

    ov = ["model.dtype=float32", "algo.beta=0.1", f"algo.num_iterations={ITERS}", "train.micro_batch_size=2",
          "train.share_prompt_forward=false", "train.learning_rate=0.01", "train.warmup_steps=0",
          "train.max_grad_norm=1e9", "train.skip_zero_advantage=false"]
    if lora:
        ov += ["model.lora.enabled=true", "model.lora.r=4", "model.lora.target_modules=[q_proj, v_proj]"]
    cfg = load_config(None, ov)
    torch.manual_seed(0)
    model = load_model(str(model_dir))
    if lora:
        model = apply_lora(model, cfg.model)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():  # B starts at 0: the adapters matter from the first pass
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
    tr = PolicyTrainer(cfg, model, pad_id=0)
    assert (tr.ref_model is None) == lora

    counts = {"policy": 0, "reference": 0}
    if lora:
        from peft.tuners.lora import LoraLayer

        layer = next(m for m in model.modules() if isinstance(m, LoraLayer))

        def count(mod, args, kwargs):
            counts["reference" if layer.disable_adapters else "policy"] += 1

        _decoder(model).register_forward_pre_hook(count, with_kwargs=True)
    else:
        _decoder(model).register_forward_pre_hook(lambda *a: counts.__setitem__("policy", counts["policy"] + 1))
        _decoder(tr.ref_model).register_forward_pre_hook(
            lambda *a: counts.__setitem__("reference", counts["reference"] + 1))

    if recompute_every_pass:
        last = {}
        forward, kl_penalty, reference = policy_mod.response_logprobs, policy_mod.algos.kl_penalty, tr._ref_logprobs

        def policy_forward(m, batch, *a, **k):
            if torch.is_grad_enabled():  # the policy's forward of this micro-batch, at this pass
                last["batch"] = batch
            return forward(m, batch, *a, **k)

        def fresh_kl(logp, ref, estimator):
            again = reference(last["batch"])
            assert torch.equal(again, ref)  # what the update holds is what a new forward gives
            return kl_penalty(logp, again, estimator)

        monkeypatch.setattr(policy_mod, "response_logprobs", policy_forward)
        monkeypatch.setattr(policy_mod.algos, "kl_penalty", fresh_kl)

    grads, step = [], tr.optimizer.step
    tr.optimizer.step = lambda: (grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                                               if p.grad is not None}), step())
    samples = _samples()
    tr.compute_advantages(samples)
    m = tr.update(samples)
    monkeypatch.undo()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    return grads, m, weights, counts


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full_reference"])
def test_the_kl_reference_is_one_forward_per_micro_batch_and_the_update_is_unchanged(tiny_model_dir, monkeypatch,
                                                                                      lora):
    micro = -(-len(_samples()) // 2)  # train.micro_batch_size=2: every sample forwarded (a KL term needs them all)
    grads, m, weights, counts = _update(tiny_model_dir, lora, monkeypatch, recompute_every_pass=False)
    assert len(grads) == ITERS
    assert counts == {"policy": ITERS * micro, "reference": micro}  # was ITERS * micro reference forwards
    assert m["loss/kl"] > 0  # the KL term acts (the passes moved the policy off its reference)

    again, m_again, w_again, counts_again = _update(tiny_model_dir, lora, monkeypatch, recompute_every_pass=True)
    assert counts_again["reference"] == micro + ITERS * micro  # the check's own forwards, one per pass
    assert m == m_again
    for k in range(ITERS):
        assert grads[k].keys() == again[k].keys()
        for n in grads[k]:
            assert torch.equal(grads[k][n], again[k][n]), (k, n)
    assert all(torch.equal(weights[n], w_again[n]) for n in weights)
    assert any(not torch.equal(grads[0][n], grads[-1][n]) for n in grads[0])  # the later passes saw moved weights


@pytest.mark.parametrize("end", ["finished", "ctrl_c"])
@pytest.mark.parametrize("which", ["sync", "async"])
def test_a_real_run_used_as_a_library_puts_the_hook_back(tiny_model_dir, tmp_path, recorder, monkeypatch, which, end):
    """Both loops, run to the end or stopped by Ctrl-C, with TensorBoard on: the caller's hook is threading's again."""
    from test_e2e import _args

    from rollwise.cli import main
    from rollwise.training.policy import PolicyTrainer

    seen = []
    update = PolicyTrainer.update

    def spy(self, *a, **k):
        seen.append(threading.excepthook is not recorder)  # rollwise's hook is on while the run trains
        if end == "ctrl_c" and len(seen) == 2:
            raise KeyboardInterrupt
        return update(self, *a, **k)

    monkeypatch.setattr(PolicyTrainer, "update", spy)
    extra = ["run.tensorboard=true", "eval.at_start=false", "eval.at_end=false",
             *(["distributed.async_training=true", "distributed.max_staleness=1"] if which == "async" else [])]
    assert main(["train", *_args(tiny_model_dir, tmp_path, "run", 2, extra)]) == (0 if end == "finished" else 130)
    assert seen and all(seen)
    assert threading.excepthook is recorder and recorder.seen == []
