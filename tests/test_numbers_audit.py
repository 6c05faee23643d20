"""The numbers `rollwise report` (one run and several) and the end-of-run summary show, checked against
hand-computed values of small hand-made run folders (config.yaml and metrics.jsonl; no model is trained)."""

import json

import yaml

from rollwise.compare import compare_table, curve, paired_by_seed
from rollwise.report import panels_of, unseen_solve_rate
from rollwise.tracking import read_metrics
from rollwise.ui import print_summary, stop_reason, summarize

# ---------------------------------------------------------------- a run folder written by hand

EFF = [0.5, 0.25, 0.75, 1.0, 0.5, 0.25]  # mean 3.25 / 6 = 0.5417
REWARD = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]


def _step(s, **more):
    return {"step": s, "rollout/reward_mean": REWARD[s - 1], "rollout/accuracy": REWARD[s - 1],
            "rollout/rollouts": 16.0, "rollout/tokens": 100.0 * s, "rollout/discarded_rollouts": float(s % 2) * 4,
            "rollout/discarded_tokens": float(s % 2) * 40, "rollout/rollouts_total": 16.0 * s,
            "rollout/tokens_total": 50.0 * s * (s + 1), "planner/effective_ratio": EFF[s - 1],
            "time/step_s": float(s), "time/generate_s": s / 2, "train/skipped_zero_adv": 2.0,
            "reward/errors": 1.0 if s == 3 else 0.0, **more}


def _folder(path, rows, cfg=None, checkpoint=None, envs=None):
    path.mkdir(parents=True)
    cfg = cfg or {}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if checkpoint is not None:
        (path / "checkpoints" / f"step_{checkpoint:06d}").mkdir(parents=True)
    if envs is not None:
        from rollwise.environment import describe_environment

        env = describe_environment()
        (path / "environment.json").write_text(json.dumps([{**env, **e} for e in envs]))
    return path


CFG = {"run": {"name": "r", "seed": 0}, "planner": {"strategy": "uniform"},
       "train": {"max_steps": 6, "max_rollout_tokens": None},
       "eval": {"at_end": True, "every_n_steps": 3, "early_stopping_patience": 0}, "data": {"eval_size": 100}}


def _six_steps():
    rows = [{"step": 0, "time/setup_s": 2.0, "data/eval_items": 100.0}, {"step": 0, "eval/accuracy": 0.2}]
    for s in range(1, 7):
        rows.append(_step(s))
        if s % 3 == 0:
            rows.append({"step": s, "eval/accuracy": {3: 0.35, 6: 0.3}[s], "eval/pass@4": 0.5})
    return rows


def test_the_summary_of_a_finished_run_is_its_metrics(tmp_path, capsys):
    run = _folder(tmp_path / "r", _six_steps(), CFG, checkpoint=6)
    s = print_summary(run)
    assert s["steps"] == 6 and s["stopped by"] == "train.max_steps=6" and s["planner"] == "uniform"
    assert s["eval accuracy (first)"] == "0.200 @ step 0"
    assert s["eval accuracy (last)"] == "0.300 @ step 6"
    assert s["eval accuracy (best)"] == "0.350 @ step 3"
    assert s["eval/pass@4"] == "0.500"
    # 6 steps: quarters of 1 step
    assert s["train reward (first quarter)"] == "0.100" and s["train reward (last quarter)"] == "0.600"
    assert s["rollouts generated"] == 96 and s["rollout tokens"] == 2100  # 16 * 6; 50 * 6 * 7
    assert s["effective ratio (mean)"] == f"{sum(EFF) / 6:.2f}" == "0.54"
    assert s["median step time (s)"] == "3.5" and s["generation share of step time"] == "50%"
    assert s["skipped zero-advantage samples"] == "12" and s["reward failures (scored 0)"] == 1
    out = capsys.readouterr().out
    assert "2100" in out and "0.54" in out


def test_the_summary_of_a_resumed_run_counts_the_redone_steps_once(tmp_path):
    """A resume from the checkpoint at step 2: metrics.jsonl as the tracker leaves it (steps after 2 dropped, then
    trained again), plus a copy that still holds the first attempt's steps 3-4 (later lines win)."""
    first = [r for r in _six_steps() if r["step"] <= 4]
    first = [{**r, "rollout/reward_mean": 9.0} if "rollout/reward_mean" in r and r["step"] > 2 else r for r in first]
    again = [{"step": 2, "time/setup_s": 1.0, "data/eval_items": 100.0}] + [r for r in _six_steps() if r["step"] > 2]
    envs = [{"resumed_from_step": None}, {"resumed_from_step": 2, "config_changes": {"train.learning_rate": [1, 2]}}]
    run = _folder(tmp_path / "r", first + again, CFG, checkpoint=6, envs=envs)
    s = print_summary(run)
    assert s["steps"] == 6 and s["stopped by"] == "train.max_steps=6"
    assert s["resumed at"] == "step 2 (train.learning_rate: 1 -> 2)"
    assert s["rollouts generated"] == 96 and s["rollout tokens"] == 2100
    assert s["effective ratio (mean)"] == "0.54" and s["train reward (last quarter)"] == "0.600"
    assert s["skipped zero-advantage samples"] == "12"  # 6 steps, not 8
    assert s["eval accuracy (best)"] == "0.350 @ step 3"


def test_a_run_with_no_evaluation_and_one_stopped_early(tmp_path):
    rows = [r for r in _six_steps() if "eval/accuracy" not in r]
    cfg = {**CFG, "eval": {"at_end": False, "every_n_steps": 0}}
    s = print_summary(_folder(tmp_path / "none", rows, cfg, checkpoint=6))
    assert not any(k.startswith("eval") for k in s) and s["stopped by"] == "train.max_steps=6"
    row = compare_table([tmp_path / "none"])[2]
    assert row == f"| {tmp_path / 'none'} | uniform | 6 | no evaluation | 2,100 | 1.00 | - | 0.54 |"
    # early stopping after the evaluations at 3 and 6 of a 9-step run with a patience of 2
    rows = [{"step": 0, "eval/accuracy": 0.4, "eval/evals_since_best": 0.0}]
    for st in range(1, 7):
        rows.append(_step(st))
        if st % 3 == 0:
            rows.append({"step": st, "eval/accuracy": 0.3, "eval/evals_since_best": st / 3})
    cfg = {**CFG, "train": {"max_steps": 9}, "eval": {"at_end": True, "every_n_steps": 3, "early_stopping_patience": 2}}
    s = print_summary(_folder(tmp_path / "early", rows, cfg, checkpoint=6))
    assert s["stopped by"] == "early stopping (eval.early_stopping_patience=2) at step 6 of 9"
    assert s["eval accuracy (best)"] == "0.400 @ step 0" and s["eval accuracy (last)"] == "0.300 @ step 6"


# ---------------------------------------------------------------- rollwise report RUN_A RUN_B: the pairing


def _cmp_run(path, strategy, seed, tokens_per_step, final, steps=4, max_steps=4, evals=(0, 4), checkpoint=None):
    cfg = {"run": {"name": path.name, "seed": seed}, "planner": {"strategy": strategy},
           "train": {"max_steps": max_steps}}
    rows = []
    for st in range(steps + 1):
        if st:
            rows.append({"step": st, "rollout/reward_mean": 0.5, "rollout/tokens_total": st * tokens_per_step,
                         "planner/effective_ratio": 0.5})
        if st in evals:
            rows.append({"step": st, "eval/accuracy": 0.2 if st == 0 else final})
    return _folder(path, rows, cfg, checkpoint=checkpoint)


def test_the_pairing_by_seed_is_the_mean_paired_difference_and_its_standard_error(tmp_path):
    finals = {"uniform": [0.40, 0.30, 0.50], "adaptive": [0.45, 0.29, 0.52]}  # +5, -1, +2 points
    tokens = {"uniform": [100, 100, 200], "adaptive": [50, 80, 100]}  # ratios 0.5, 0.8, 0.5
    runs = [_cmp_run(tmp_path / f"{p[0]}{s}", p, s, tokens[p][s], finals[p][s]) for p in finals for s in range(3)]
    lines = paired_by_seed(runs)
    # mean +2.0; SD sqrt((9 + 9 + 0) / 2) = 3; SE 3 / sqrt(3) = 1.73; tokens mean 0.6
    assert lines == ["paired by run.seed with planner.strategy=uniform (final held-out accuracy, rollout tokens):",
                     "  planner.strategy=adaptive: +2.0 points (SE 1.7), ahead on 2 of 3 seeds; 0.60 of the tokens "
                     "(0.50-0.80)"]
    assert not any("signific" in ln for ln in lines)
    # the order of the runs does not change the pairing
    assert paired_by_seed([runs[0], *reversed(runs[1:])]) == lines


def test_a_run_that_did_not_finish_is_not_paired_with_its_last_evaluation_as_its_final_accuracy(tmp_path):
    """A run killed at step 2 of 4 after an evaluation at step 2 (eval.every_n_steps=2): its step-2 accuracy was
    paired as its final accuracy, and its half-spent tokens as its cost."""
    runs = [_cmp_run(tmp_path / "u0", "uniform", 0, 100, 0.40, evals=(0, 2, 4)),
            _cmp_run(tmp_path / "a0", "adaptive", 0, 80, 0.42, evals=(0, 2, 4)),
            _cmp_run(tmp_path / "u1", "uniform", 1, 100, 0.30, evals=(0, 2, 4)),
            _cmp_run(tmp_path / "a1", "adaptive", 1, 60, 0.26, evals=(0, 2, 4)),
            _cmp_run(tmp_path / "u2", "uniform", 2, 100, 0.50, evals=(0, 2, 4)),
            _cmp_run(tmp_path / "a2", "adaptive", 2, 50, 0.10, steps=2, evals=(0, 2), checkpoint=2)]
    assert stop_reason(yaml.safe_load((runs[5] / "config.yaml").read_text()), read_metrics(runs[5]),
                       runs[5]).startswith("not finished: step 2 of 4")
    lines = paired_by_seed(runs)
    # seeds 0 and 1 only: +2 and -4 points, mean -1.0, SE 3.0; tokens 0.80 and 0.60
    assert lines[1] == ("  planner.strategy=adaptive: -1.0 points (SE 3.0), ahead on 1 of 2 seeds; 0.70 of the tokens "
                        "(0.60-0.80)"), lines
    assert any(str(runs[5]) in ln and "not finished" in ln for ln in lines), lines
    # the table says so too
    rows = compare_table([runs[0], runs[5]])
    assert any(str(runs[5]) in ln and "not finished" in ln for ln in rows[4:]), rows


def test_a_run_evaluated_once_shows_no_gain_it_did_not_measure(tmp_path):
    """eval.at_start=false: one evaluation, after training. The table showed '30.0% -> 30.0% (+0.0)', a gain of
    0 points that no evaluation measured."""
    a = _cmp_run(tmp_path / "a", "uniform", 0, 100, 0.3, evals=(4,))
    row = compare_table([a])[2]
    assert "+0.0" not in row and "30.0%" in row, row


def test_unequal_budgets_and_steps_show_in_the_table(tmp_path):
    a = _cmp_run(tmp_path / "a", "uniform", 0, 100, 0.4)
    b = _cmp_run(tmp_path / "b", "adaptive", 0, 30, 0.5, steps=6, max_steps=6, evals=(0, 6))
    rows = compare_table([a, b])
    # b: 6 steps, 180 tokens = 0.45 of a's 400; a's final 40% first reached by b at its step-6 evaluation (180)
    assert rows[3] == f"| {b} | adaptive | 6 | 20.0% -> 50.0% (+30.0) | 180 | 0.45 | 180 (0.45) | 0.50 |"
    c = curve(b)
    assert c["points"] == [(0.0, 0.2), (180.0, 0.5)] and c["tokens"] == 180 and c["steps"] == 6


# ---------------------------------------------------------------- rollwise report RUN_DIR: the plotted series


def test_each_panel_draws_the_metric_it_is_labelled_with_against_step():
    hist = _six_steps()
    panels = {t: d for t, _, d in panels_of(hist)}
    steps = [r for r in hist if "rollout/reward_mean" in r]
    assert panels["training reward"] == [("", [(r["step"], r["rollout/reward_mean"]) for r in steps])]
    assert panels["rollout tokens (cumulative)"] == [("", [(s, 50.0 * s * (s + 1)) for s in range(1, 7)])]
    assert panels["held-out accuracy"] == [("", [(0, 0.2), (3, 0.35), (6, 0.3)])]
    assert panels["rollouts per step"] == [("generated (discarded included)", [(s, 16.0) for s in range(1, 7)]),
                                           ("discarded", [(s, float(s % 2) * 4) for s in range(1, 7)])]
    assert panels["rollout tokens per step"][0] == ("generated (discarded included)",
                                                    [(s, 100.0 * s) for s in range(1, 7)])
    assert panels["effective ratio"] == [("of rollouts generated", list(zip(range(1, 7), EFF)))]


def test_the_solve_rate_on_new_prompts_is_in_blocks_of_5_steps():
    # step s rolls out a new prompt n{s} (first sample correct on even steps) and the old prompt p again
    steps = [{"step": s, "rollout/reward_mean": 0.1,
              "rollout/groups": [[f"n{s}", "10" if s % 2 == 0 else "01", [5, 6]], ["p", "1111", [1, 1, 1, 1]]]}
             for s in range(1, 13)]
    # p is new at step 1 only (first sample correct). Block 1-5: n1..n5 -> 0,1,0,1,0 plus p 1 -> 3/6;
    # block 6-10: n6..n10 -> 1,0,1,0,1 -> 3/5; block 11-12: n11 0, n12 1 -> 1/2, drawn at step 12
    assert unseen_solve_rate(steps) == [(5.0, 0.5), (10.0, 0.6), (12.0, 0.5)]
    assert unseen_solve_rate(list(reversed(steps))) == unseen_solve_rate(steps)


def test_the_best_weights_line_names_the_accuracy_they_scored(tmp_path):
    """With eval.early_stopping_min_delta the saved best is the first evaluation to beat the best by more than the
    delta: 'eval accuracy (best)' (the highest evaluation) and the best weights' step can differ, so the weights'
    line says their accuracy."""
    rows = [{"step": 0, "eval/accuracy": 0.3}, _step(1), _step(2), {"step": 2, "eval/accuracy": 0.305}]
    run = _folder(tmp_path / "r", rows, {**CFG, "train": {"max_steps": 2}}, checkpoint=2)
    (run / "checkpoints" / "best").mkdir()
    (run / "checkpoints" / "best" / "best.json").write_text(json.dumps({"step": 0, "accuracy": 0.3}))
    s = print_summary(run)
    assert s["eval accuracy (best)"] == "0.305 @ step 2"
    assert s["best weights (eval.save_best)"] == f"{run / 'checkpoints' / 'best'} (step 0, accuracy 0.300)"


def test_summarize_reads_the_last_totals_whatever_steps_lack_them():
    rows = [_step(1), _step(2), {"step": 3, "rollout/reward_mean": 0.5}]
    s = summarize(rows)
    assert s["rollouts generated"] == 32 and s["rollout tokens"] == 300 and s["steps"] == 3


def _figure(monkeypatch, draw):
    """The figure `draw()` hands to matplotlib (plt.close is where it lets go of it)."""
    import matplotlib.pyplot as plt

    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    draw()
    return figs[0]


def test_the_report_hands_matplotlib_the_logged_values(tmp_path, monkeypatch):
    from rollwise.report import plot_run

    run = _folder(tmp_path / "r", _six_steps(), CFG, checkpoint=6)
    axes = {ax.get_title(): ax for ax in _figure(monkeypatch, lambda: plot_run(run)).axes}

    def lines(title):
        return [(list(ln.get_xdata()), list(ln.get_ydata())) for ln in axes[title].get_lines()]

    assert lines("rollout tokens (cumulative)") == [([1, 2, 3, 4, 5, 6], [100.0, 300.0, 600.0, 1000.0, 1500.0, 2100.0])]
    assert lines("training reward") == [([1, 2, 3, 4, 5, 6], REWARD)]
    assert lines("held-out accuracy") == [([0, 3, 6], [0.2, 0.35, 0.3])]
    assert lines("effective ratio") == [([1, 2, 3, 4, 5, 6], EFF)]
    assert all(axes[t].get_xlabel() == "step" for t in ("rollout tokens (cumulative)", "training reward"))


def test_the_comparison_draws_accuracy_at_the_cumulative_tokens_before_each_evaluation(tmp_path, monkeypatch):
    from rollwise.compare import plot_comparison

    a = _cmp_run(tmp_path / "a", "uniform", 0, 100, 0.4, evals=(0, 2, 4))
    b = _cmp_run(tmp_path / "b", "adaptive", 0, 30, 0.5, steps=6, max_steps=6, evals=(0, 6))
    fig = _figure(monkeypatch, lambda: plot_comparison([a, b], tmp_path / "c.png"))
    got = [{ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()} for ax in fig.axes]
    assert got[0] == {str(a): ([0.0, 200.0, 400.0], [0.2, 0.4, 0.4]), str(b): ([0.0, 180.0], [0.2, 0.5])}
    assert got[1] == {str(a): ([0, 2, 4], [0.2, 0.4, 0.4]), str(b): ([0, 6], [0.2, 0.5])}
    assert got[2] == {str(a): ([1, 2, 3, 4], [100, 200, 300, 400]), str(b): ([1, 2, 3, 4, 5, 6],
                                                                             [30, 60, 90, 120, 150, 180])}
    assert [ax.get_xlabel() for ax in fig.axes] == ["rollout tokens (cumulative)", "step", "step"]


def test_runs_left_out_of_the_pairing_are_named_even_when_no_pair_is_left(tmp_path):
    """Two seeds, one run killed: one seed in common, so no pair; the pairing said nothing at all, not why."""
    runs = [_cmp_run(tmp_path / "u0", "uniform", 0, 100, 0.40), _cmp_run(tmp_path / "a0", "adaptive", 0, 80, 0.42),
            _cmp_run(tmp_path / "u1", "uniform", 1, 100, 0.30),
            _cmp_run(tmp_path / "a1", "adaptive", 1, 60, 0.1, steps=2, evals=(0, 2), checkpoint=2)]
    lines = paired_by_seed(runs)
    assert lines[0].startswith("not paired by run.seed with planner.strategy=uniform: fewer than 2 seeds"), lines
    assert lines[1:] == [f"  {runs[3]}: not finished (step 2 of 4); not paired"]
    # a run that never evaluated is named too
    runs.append(_cmp_run(tmp_path / "a2", "adaptive", 2, 60, 0.1, evals=()))
    assert lines[1:] + [f"  {runs[4]}: no evaluation; not paired"] == paired_by_seed(runs)[1:]


def test_an_unfinished_first_run_is_no_target_to_reach(tmp_path):
    """The first run of a table killed at step 2 of 4: its step-2 accuracy was the target the others' tokens were
    counted to, and its half-spent tokens the denominator."""
    a = _cmp_run(tmp_path / "a", "adaptive", 2, 50, 0.30, steps=2, evals=(0, 2), checkpoint=2)  # gained: 20% -> 30%
    u = _cmp_run(tmp_path / "u", "uniform", 2, 100, 0.50, evals=(0, 2, 4))
    rows = compare_table([a, u])
    assert any("no tokens-to-reach" in ln and "did not finish (step 2 of 4" in ln for ln in rows), rows
    assert rows[3].split("|")[7].strip() == "-", rows[3]
