"""What a user reads after a run (report panels, TensorBoard, comparisons), on hand-built run folders: no model."""

from __future__ import annotations

import json
import time

from rollwise.tracking import Tracker, read_metrics


def _points_as_rustboard_reads_them(logdir) -> dict[str, dict[int, float]]:
    """Every scalar in the event files, read as TensorBoard's default reader (its Rust data server) reads them: files
    in name order, a metric's point at a step replacing that metric's points from that step on; purge_step ignored."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    seen: dict[str, dict[int, float]] = {}
    for path in sorted(p for p in logdir.iterdir() if "tfevents" in p.name):
        for raw in RawEventFileLoader(str(path)).Load():
            ev = Event.FromString(raw)
            for v in ev.summary.value:
                if v.HasField("simple_value"):
                    pts = seen.setdefault(v.tag, {})
                    for s in [s for s in pts if s >= ev.step]:
                        del pts[s]
                    pts[ev.step] = round(v.simple_value, 6)
    return seen


def test_a_resume_leaves_tensorboard_no_point_of_the_replaced_attempt(tmp_path):
    """A metric logged on some steps only (rollout/dropped_stale) kept the killed attempt's point after the
    checkpoint in TensorBoard's default reader, which ignores purge_step: metrics.jsonl had dropped it."""
    t = Tracker(tmp_path, truncate_after_step=-1)
    for step in range(1, 6):
        t.log(step, {"rollout/reward_mean": 0.1 * step, **({"rollout/dropped_stale": 7.0} if step == 4 else {})})
    t.close()
    time.sleep(1.1)  # event files are named by the second they are opened
    r = Tracker(tmp_path, truncate_after_step=2)  # resumed from the checkpoint of step 2
    r.log(2, {"time/setup_s": 1.0})
    for step in range(3, 6):
        r.log(step, {"rollout/reward_mean": 0.5, **({"rollout/dropped_stale": 1.0} if step == 5 else {})})
    r.close()
    jsonl: dict[str, dict[int, float]] = {}
    for row in read_metrics(tmp_path):
        for k, v in row.items():
            if k != "step":
                jsonl.setdefault(k, {})[row["step"]] = round(v, 6)
    assert _points_as_rustboard_reads_them(tmp_path / "tensorboard") == jsonl
    assert jsonl["rollout/dropped_stale"] == {5: 1.0}
    # a start again (no checkpoint) keeps no event of the earlier attempt
    Tracker(tmp_path, truncate_after_step=-1).close()
    assert _points_as_rustboard_reads_them(tmp_path / "tensorboard") == {}
    assert read_metrics(tmp_path) == []


def test_a_task_given_no_rollout_in_a_step_is_drawn_at_zero_share():
    """The planner logs planner/task_share/<task> only for tasks rolled out in the step: the panel drew a line
    straight across such a step (0.5 at step 2 here) instead of the share it had, 0."""
    from rollwise.report import panels_of

    hist = [{"step": 1, "rollout/reward_mean": 0.1, "planner/task_share/gcd": 0.5, "planner/task_share/sum": 0.5},
            {"step": 2, "rollout/reward_mean": 0.1, "planner/task_share/sum": 1.0},
            {"step": 3, "rollout/reward_mean": 0.1, "planner/task_share/gcd": 0.5, "planner/task_share/sum": 0.5}]
    data = {title: data for title, _, data in panels_of(hist)}["share of rollouts per task"]
    assert data == [("gcd", [(1, 0.5), (2, 0.0), (3, 0.5)]), ("sum", [(1, 0.5), (2, 1.0), (3, 0.5)])]


def _drawn(tmp_path, monkeypatch, rows):
    """The axes `rollwise report` draws for a run folder of `rows`, by title."""
    import matplotlib.pyplot as plt

    from rollwise.report import plot_run

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    plot_run(tmp_path)
    return {ax.get_title(): ax for ax in figs[0].axes}


def test_the_histogram_centres_each_count_and_steps_are_whole(tmp_path, monkeypatch):
    """A bar for 4 samples spanned 4 to 5 (read as 4.5), and a run of one step had ticks at step 0.96, 0.98..."""
    axes = _drawn(tmp_path, monkeypatch, [{"step": 1, "rollout/reward_mean": 0.5, "rollout/tokens_total": 10.0,
                                           "planner/samples_per_prompt": [4, 4, 8]}])
    bars = {(p.get_x() + p.get_width() / 2, p.get_height()) for p in axes["samples per prompt (every step)"].patches
            if p.get_height()}
    assert bars == {(4.0, 2.0), (8.0, 1.0)}
    for title in ("training reward", "samples per prompt (every step)"):
        ticks = axes[title].get_xticks()
        assert len(ticks) and all(float(t).is_integer() for t in ticks)


def test_the_estimators_bias_is_not_labelled_as_over_the_prompts_seen_before():
    """planner/prediction_bias is over every prompt rolled out (as planner/brier), drawn beside the line 'prompts
    seen before': it was labelled 'bias (predicted - seen)'."""
    from rollwise.report import panels_of

    hist = [{"step": 1, "rollout/reward_mean": 0.1, "planner/brier": 0.2, "planner/brier_seen": 0.1,
             "planner/prediction_bias": -0.1}]
    labels = [label for label, _ in {t: d for t, _, d in panels_of(hist)}["estimator's Brier score"]]
    assert labels == ["every prompt rolled out", "prompts seen before", "bias (predicted - observed)"]


def test_the_report_draws_rollouts_and_tokens_per_step_with_the_discarded_ones():
    """rollout/rollouts, rollout/tokens and the discarded ones (what the planner spends and wastes) had no panel:
    only the cumulative tokens were drawn."""
    from rollwise.report import panels_of

    hist = [{"step": s, "rollout/reward_mean": 0.1, "rollout/rollouts": 32.0, "rollout/discarded_rollouts": 4.0 * s,
             "rollout/tokens": 3200.0, "rollout/discarded_tokens": 100.0 * s} for s in (1, 2)]
    panels = {title: data for title, _, data in panels_of(hist)}
    assert panels["rollouts per step"] == [("generated (discarded included)", [(1, 32.0), (2, 32.0)]),
                                           ("discarded", [(1, 4.0), (2, 8.0)])]
    assert panels["rollout tokens per step"] == [("generated (discarded included)", [(1, 3200.0), (2, 3200.0)]),
                                                 ("discarded", [(1, 100.0), (2, 200.0)])]
    # adaptive's screen also logs the top-ups its step budget refused (rollouts it chose not to spend)
    hist[1]["planner/refused_rollouts"] = 12.0
    assert {t: d for t, _, d in panels_of(hist)}["rollouts per step"][-1] == ("top-ups the budget refused", [(2, 12.0)])


def test_a_compared_run_of_one_step_is_drawn(tmp_path, monkeypatch):
    """compare.png drew rollout tokens against step as lines without markers: a run of one step had no line to
    draw, so it showed in the legend only; and its step axis had ticks at step 0.25, 0.5..."""
    import matplotlib.pyplot as plt

    from rollwise.compare import plot_comparison

    runs = []
    for name, rows in (("a", [{"step": 0, "eval/accuracy": 0.2}, {"step": 1, "rollout/reward_mean": 0.5,
                                                                   "rollout/tokens_total": 100.0},
                              {"step": 2, "rollout/reward_mean": 0.5, "rollout/tokens_total": 200.0},
                              {"step": 2, "eval/accuracy": 0.4}]),
                       ("b", [{"step": 1, "rollout/reward_mean": 0.5, "rollout/tokens_total": 50.0}])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(tmp_path / name)
    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    plot_comparison(runs, tmp_path / "cmp.png")
    tokens = figs[0].axes[2]
    one = [ln for ln in tokens.get_lines() if ln.get_label() == str(runs[1])]
    assert len(one) == 1 and list(one[0].get_xdata()) == [1] and one[0].get_marker() not in (None, "None", "")
    for ax in figs[0].axes[1:]:
        assert all(float(t).is_integer() for t in ax.get_xticks())


def test_the_dual_clip_metric_is_documented_as_logged_by_every_ppo_clip_run():
    """docs/metrics.md gave loss/dual_clip_frac as a metric of ppo_clip with algo.dual_clip; every ppo_clip run (the
    default) logs it, as 0 without a dual clip."""
    from pathlib import Path

    import torch

    from rollwise.algos.losses import POLICY_LOSSES

    lp = torch.zeros(2, 3)
    _, metrics = POLICY_LOSSES["ppo_clip"](lp, lp - 0.1, torch.tensor([1.0, -1.0]), torch.ones(2, 3))
    assert float(metrics["dual_clip_frac"]) == 0.0
    row = next(ln for ln in (Path(__file__).parents[1] / "docs" / "metrics.md").read_text().splitlines()
               if ln.startswith("| `loss/dual_clip_frac`"))
    assert "0 without a dual clip" in row
