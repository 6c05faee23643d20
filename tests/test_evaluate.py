"""evaluate(): the held-out metrics from a stub engine and verifier, counted by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rollwise.engine.hf import GenerationOutput
from rollwise.evaluate import evaluate
from rollwise.types import PromptItem


class StubEngine:
    def __init__(self, outs: list[tuple[list[int], str]]):
        self.outs = outs

    def generate(self, reqs, generator=None):
        assert all(r.greedy for r in reqs)
        return [GenerationOutput(ids, [0.0] * len(ids), [0] * len(ids), why) for ids, why in self.outs]


class StubRunner:
    """Scores 1 when the decoded answer equals the item's answer."""

    def score(self, texts, items):
        parts = [{"correct": float(t == it.answer)} for t, it in zip(texts, items)]
        return SimpleNamespace(parts=parts, rewards=[p["correct"] for p in parts], errors=0, timeouts=0, nans=0)


class StubTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids)


def item(uid: str, task: str, answer: str) -> PromptItem:
    return PromptItem(uid=uid, task=task, question="q", answer=answer)


def test_accuracy_lengths_and_truncated_share_per_answer() -> None:
    items = [item("1", "x", "ab"), item("2", "x", "c"), item("3", "y", "dd"), item("4", "y", "e")]
    outs = [([0, 1], "stop"), ([2, 2, 2, 2], "length"), ([3, 3], "stop"), ([4, 4, 4, 4], "length")]
    m = evaluate(StubEngine(outs), items, [[1]] * 4, StubRunner(), "correct", StubTokenizer(), max_new_tokens=4)
    assert m["eval/accuracy"] == 0.5  # "ab" and "dd" right; the two cut at 4 tokens wrong
    assert m["eval/accuracy/x"] == 0.5 and m["eval/accuracy/y"] == 0.5
    assert m["eval/response_len_mean"] == pytest.approx((2 + 4 + 2 + 4) / 4)
    assert m["eval/truncated_frac"] == 0.5
    assert m["eval/items"] == 4.0


def test_partial_credit_the_planner_counts_as_a_success_is_measured():
    """reasoning_gym scores "-41" for "-4" 0.67: at planner.success_threshold=0.5 the planner counts it
    solved while the first reward function does not score it correct."""
    from rollwise.evaluate import success_not_correct

    samples = [SimpleNamespace(reward=r, reward_parts={"rg": p}) for r, p in
               ((1.0, 1.0), (0.67, 0.67), (0.3, 0.3), (0.0, 0.0))]
    assert success_not_correct(samples, 0.5, "rg") == 0.25
    assert success_not_correct(samples, 0.7, "rg") == 0.0 and success_not_correct([], 0.5, "rg") == 0.0


class SampledStub(StubEngine):
    """Greedy answers, then pass@k's sampled ones, in request order."""

    def __init__(self, greedy, sampled):
        self.greedy, self.sampled = greedy, sampled

    def generate(self, reqs, generator=None):
        outs = self.greedy if all(r.greedy for r in reqs) else self.sampled
        assert len(outs) == len(reqs) and (generator is not None or outs is self.greedy)
        return [GenerationOutput(ids, [0.0] * len(ids), [0] * len(ids), "stop") for ids in outs]


def test_pass_at_k_counts_an_item_with_any_right_sample() -> None:
    items = [item("1", "x", "ab"), item("2", "x", "c"), item("3", "y", "dd")]
    greedy = [[0, 0], [3], [3, 3]]  # greedy: only item 3 right
    # 2 samples per item in order: item 1 wrong then right, item 2 wrong twice, item 3 right then wrong
    sampled = [[1], [0, 1], [0], [4], [3, 3], [3]]
    m = evaluate(SampledStub(greedy, sampled), items, [[1]] * 3, StubRunner(), "correct", StubTokenizer(),
                 max_new_tokens=4, pass_k=2)
    assert m["eval/accuracy"] == pytest.approx(1 / 3)
    assert m["eval/pass@2"] == pytest.approx(2 / 3)


def test_rollwise_eval_says_the_rollout_engine_settings_it_does_not_read(tiny_model_dir, capsys):
    from rollwise.evalcmd import _target_config

    cfg, _ = _target_config(str(tiny_model_dir), ["rollout.batch_size=8", "rollout.engine=hf", "eval.batch_size=4"])
    err = capsys.readouterr().err
    assert "rollout.batch_size, rollout.engine has no effect here" in err and "set eval.batch_size" in err, err
    assert cfg.eval.batch_size == 4
    _target_config(str(tiny_model_dir), ["eval.batch_size=4"])
    assert "warning" not in capsys.readouterr().err
    _target_config(str(tiny_model_dir), ["train.max_steps=99", "eval.every_n_steps=3", "eval.pass_k=2",
                                         "rollout.temperature=0.5"])
    err = capsys.readouterr().err
    assert "train.max_steps, eval.every_n_steps has no effect here: it is a setting of training" in err, err


def test_report_on_a_run_still_starting_says_so(tmp_path):
    from rollwise.tracking import read_metrics

    (tmp_path / "config.yaml").write_text("run: {}\n")
    with pytest.raises(FileNotFoundError, match="has no metrics yet: the run is still starting"):
        read_metrics(tmp_path)
