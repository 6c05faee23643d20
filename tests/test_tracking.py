"""Metrics files survive what kills runs: a partial last line (killed mid-write) and a full disk."""

import errno
import json

import pytest

from rollwise.tracking import StorageError, Tracker, read_metrics


def test_resume_drops_a_partial_last_line_and_later_steps(tmp_path):
    t = Tracker(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        t.log(step, {"rollout/reward_mean": 0.1 * step})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "rollout/rew')  # killed while writing step 4
    Tracker(tmp_path, tensorboard=False, truncate_after_step=2).log(3, {"rollout/reward_mean": 0.5})
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["rollout/reward_mean"] == 0.5


def test_resume_keeps_the_checkpoint_step_in_tensorboard_and_drops_later_ones(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = Tracker(tmp_path)
    for step in (1, 2, 3):
        t.log(step, {"rollout/reward_mean": 0.1 * step})
    t.close()
    r = Tracker(tmp_path, truncate_after_step=2)  # resumed from the checkpoint of step 2
    r.log(3, {"rollout/reward_mean": 0.9})
    r.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    seen = {e.step: round(e.value, 6) for e in acc.Scalars("rollout/reward_mean")}
    assert seen == {1: 0.1, 2: 0.2, 3: 0.9}


def test_tensorboard_gets_the_finite_scalars_and_metrics_jsonl_everything(tmp_path):
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = Tracker(tmp_path)
    t.log(1, {"loss/policy": 0.5, "train/grad_norm": float("nan"), "rollout/groups": [[1, 0]], "train/sequences": 8,
              "planner/samples_per_prompt": [2, 8, 8]})
    t.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"loss/policy", "train/sequences"}
    assert acc.Tags()["histograms"] == ["planner/samples_per_prompt"]
    h = acc.Histograms("planner/samples_per_prompt")[0].histogram_value
    assert (h.min, h.max, h.num, h.sum) == (2.0, 8.0, 3.0, 18.0)
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert row["rollout/groups"] == [[1, 0]] and row["train/sequences"] == 8.0 and row["train/grad_norm"] != 0


def test_read_metrics_skips_a_partial_last_line(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a"')
    assert read_metrics(tmp_path) == [{"step": 1, "a": 1.0}]
    assert "skipped 1 unreadable line" in capsys.readouterr().err
    assert read_metrics(tmp_path, warn=False) == [{"step": 1, "a": 1.0}] and not capsys.readouterr().err


def test_a_full_disk_is_a_clear_error(tmp_path, monkeypatch):
    t = Tracker(tmp_path, tensorboard=False)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("builtins.open", full)
    with pytest.raises(StorageError, match="No space left on device.*free disk space.*--resume"):
        t.log(1, {"x": 1.0})


def test_any_full_disk_error_reaches_the_user_as_a_message(monkeypatch, capsys):
    import rollwise.cli as cli

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/config.yaml")

    monkeypatch.setattr(cli, "cmd_options", full)  # build_parser looks the command up when main calls it
    assert cli.main(["options"]) == 2
    err = capsys.readouterr().err
    assert "disk full writing /runs/x/config.yaml" in err and "run the command again" in err
    assert "--resume" not in err  # only `train` has a run to resume (tests/test_errors.py)


def test_the_out_of_memory_hint_fits_the_command():
    from rollwise.cli import memory_hint

    assert "eval.batch_size" in memory_hint("eval") and "--resume" not in memory_hint("eval")
    assert "train.micro_batch_size" in memory_hint("train") and "--resume" in memory_hint("train")


@pytest.mark.parametrize("exc", ["torch", "python"])
def test_out_of_memory_is_a_message_that_says_what_to_lower(monkeypatch, capsys, exc):
    import torch

    import rollwise.cli as cli

    def oom(args):
        if exc == "torch":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
        raise MemoryError()

    monkeypatch.setattr(cli, "cmd_options", oom)
    assert cli.main(["options"]) == 2
    err = capsys.readouterr().err
    assert "out of memory" in err and "train.micro_batch_size" in err and "--resume" in err
    assert ("Tried to allocate 2.00 GiB" in err and "more detail" not in err) if exc == "torch" else "MemoryError" in err

    def cpu_allocator(args):  # what torch's CPU allocator raises: a plain RuntimeError
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 35184372088832 bytes.")

    monkeypatch.setattr(cli, "cmd_options", cpu_allocator)
    assert cli.main(["options"]) == 2
    assert "out of memory ([enforce fail" in capsys.readouterr().err

    def other(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "cmd_options", other)
    with pytest.raises(RuntimeError, match="a bug"):  # other errors still show their traceback
        cli.main(["options"])


def test_a_full_disk_under_tensorboard_is_one_message_and_no_thread_traceback(tmp_path, capsys, monkeypatch):
    """TensorBoard writes from a thread of its own; that thread re-raises a failed write and Python printed its
    traceback before the main thread turned the same error into rollwise's message."""
    import threading

    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)  # pytest's own hook would hide it
    t = Tracker(tmp_path, tensorboard=True)
    writer = t.writer._get_file_writer().event_writer._async_writer
    records = writer._writer

    def full(data):
        raise OSError(errno.ENOSPC, "No space left on device")

    records.write = full
    with pytest.raises(StorageError, match="No space left on device.*free disk space"):
        t.log(1, {"x": 1.0})
    writer._worker.join(timeout=10)  # the thread prints (or not) as it ends
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
