"""`rollwise report RUN_A RUN_B ...`: runs side by side against rollout tokens, hand-computed."""

import json

import yaml

from rollwise.cli import main
from rollwise.compare import compare_table, curve, differing_settings, tokens_to_reach


def _run(path, strategy, seed, tokens_per_step, accs, eff=None):
    """A run folder of 4 steps: evaluations at steps 0, 2 and 4 with `accs`."""
    path.mkdir()
    (path / "config.yaml").write_text(yaml.safe_dump({"run": {"name": path.name, "seed": seed},
                                                      "planner": {"strategy": strategy}, "train": {"max_steps": 4}}))
    rows = []
    for step in range(5):
        if step:
            row = {"step": step, "rollout/reward_mean": 0.5, "rollout/tokens_total": step * tokens_per_step,
                   "time/step_s": 1.0, "time/generate_s": 0.5}
            if eff is not None:
                row["planner/effective_ratio"] = eff
            rows.append(row)
        if step % 2 == 0:
            rows.append({"step": step, "eval/accuracy": accs[step // 2], "eval/response_len_mean": 20.0})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_tokens_to_reach_is_the_first_evaluation_at_or_above_the_target():
    pts = [(0, 0.2), (100, 0.3), (200, 0.5), (300, 0.4)]
    assert tokens_to_reach(pts, 0.3) == 100 and tokens_to_reach(pts, 0.45) == 200 and tokens_to_reach(pts, 0.6) is None


def test_curve_puts_each_evaluation_at_the_tokens_spent_before_it(tmp_path):
    c = curve(_run(tmp_path / "u", "uniform", 0, 100, [0.2, 0.3, 0.4], eff=0.5))
    assert c["points"] == [(0.0, 0.2), (200, 0.3), (400, 0.4)]
    assert c["steps"] == 4 and c["effective_ratio"] == 0.5 and c["answer_length"] == [20.0, 20.0]


def test_the_table_compares_every_run_with_the_first(tmp_path):
    a = _run(tmp_path / "uni", "uniform", 0, 100, [0.2, 0.3, 0.4], eff=0.5)
    b = _run(tmp_path / "ada", "adaptive", 0, 50, [0.2, 0.4, 0.45], eff=0.8)
    c = _run(tmp_path / "low", "dapo", 0, 100, [0.2, 0.25, 0.3])
    rows = compare_table([a, b, c])
    assert rows[2].startswith(f"| {a} | uniform | 4 | 20.0% -> 40.0% (+20.0) | 400 | 1.00 | 400 (1.00) | 0.50 |")
    # half the tokens in all; the first run's final 40% at its step-2 evaluation, after 100 tokens
    assert rows[3].startswith(f"| {b} | adaptive | 4 | 20.0% -> 45.0% (+25.0) | 200 | 0.50 | 100 (0.25) | 0.80 |")
    assert rows[4].startswith(f"| {c} | dapo | 4 | 20.0% -> 30.0% (+10.0) | 400 | 1.00 | never | - |")
    # a run with no evaluation cannot be said to never reach it
    lines = [ln for ln in (c / "metrics.jsonl").read_text().splitlines() if "eval/accuracy" not in ln]
    (c / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert compare_table([a, c])[3] == f"| {c} | dapo | 4 | no evaluation | 400 | 1.00 | - | - |"
    # a first run that lost accuracy is no target to reach: every row says '-', and the report says why
    d = _run(tmp_path / "fell", "uniform", 0, 100, [0.3, 0.25, 0.2])
    rows = compare_table([d, b])
    assert rows[3].startswith(f"| {b} | adaptive | 4 | 20.0% -> 45.0% (+25.0) | 200 | 0.50 | - |")
    # another seed draws other held-out items: the first run's accuracy is no target for it
    e = _run(tmp_path / "ada1", "adaptive", 1, 50, [0.2, 0.4, 0.45])
    rows = compare_table([a, e])
    assert rows[3].startswith(f"| {e} | adaptive | 4 | 20.0% -> 45.0% (+25.0) | 200 | 0.50 | - (other held-out items) |")
    assert rows[-1].startswith("(other held-out items: a run whose data.* or run.seed differs")


def test_a_comparison_against_a_first_run_that_did_not_gain_says_so(tmp_path, capsys):
    from rollwise.compare import report_runs

    d = _run(tmp_path / "fell", "uniform", 0, 100, [0.3, 0.25, 0.2])
    b = _run(tmp_path / "ada", "adaptive", 1, 50, [0.2, 0.4, 0.45], eff=0.8)
    report_runs([d, b], tmp_path / "cmp.png")
    assert "ended at or below its first evaluation" in capsys.readouterr().out


def test_differing_settings_leave_out_the_run_name():
    configs = {"a": {"run": {"name": "a", "seed": 0}, "planner": {"strategy": "uniform"}},
               "b": {"run": {"name": "b", "seed": 0}, "planner": {"strategy": "adaptive"}}}
    assert differing_settings(configs) == ["planner.strategy: uniform | adaptive"]
    assert differing_settings({"a": configs["a"], "c": configs["a"]}) == []


def test_report_of_several_runs_prints_the_table_and_draws_one_png(tmp_path, capsys):
    a = _run(tmp_path / "uni", "uniform", 0, 100, [0.2, 0.3, 0.4], eff=0.5)
    b = _run(tmp_path / "ada", "adaptive", 0, 50, [0.2, 0.4, 0.45], eff=0.8)
    png = tmp_path / "cmp.png"
    assert main(["report", str(a), str(b), "-o", str(png)]) == 0
    out = capsys.readouterr().out
    assert "planner.strategy: uniform | adaptive" in out and "| 0.50 | 100 (0.25) |" in out and str(png) in out
    assert png.stat().st_size > 1000
    assert main(["report", str(a), str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err
    # one run: its own report, drawn where -o says
    assert main(["report", str(a), "-o", str(tmp_path / "one" / "a.png")]) == 0
    assert (tmp_path / "one" / "a.png").stat().st_size > 1000 and not (a / "report.png").exists()
    # no suffix: .png, and the path printed is the file written; a format matplotlib cannot write: said first
    capsys.readouterr()
    assert main(["report", str(a), "-o", str(tmp_path / "plots")]) == 0
    assert f"plots: {tmp_path / 'plots.png'}" in capsys.readouterr().out and (tmp_path / "plots.png").is_file()
    assert main(["report", str(a), str(b), "-o", str(tmp_path / "t.txt")]) == 2
    assert "matplotlib cannot write '.txt' files" in capsys.readouterr().err and not (tmp_path / "t.txt").exists()


def test_runs_of_several_seeds_are_paired_by_seed_against_the_first_runs_group(tmp_path):
    from rollwise.compare import paired_by_seed

    runs = [_run(tmp_path / "u0", "uniform", 0, 100, [0.2, 0.3, 0.40]),
            _run(tmp_path / "a0", "adaptive", 0, 80, [0.2, 0.3, 0.42]),
            _run(tmp_path / "u1", "uniform", 1, 100, [0.2, 0.3, 0.30]),
            _run(tmp_path / "a1", "adaptive", 1, 60, [0.2, 0.3, 0.26]),
            _run(tmp_path / "a2", "adaptive", 2, 50, [0.2, 0.3, 0.50])]  # no uniform run of seed 2: not paired
    lines = paired_by_seed(runs)
    # adaptive - uniform: +2 and -4 points, mean -1.0, SD 4.24, SE 3.0; tokens 0.80 and 0.60
    assert lines == ["paired by run.seed with planner.strategy=uniform (final held-out accuracy, rollout tokens):",
                     "  planner.strategy=adaptive: -1.0 points (SE 3.0), ahead on 1 of 2 seeds; "
                     "0.70 of the tokens (0.60-0.80)"]
    assert paired_by_seed(runs[:2]) == []  # one seed: nothing to pair beyond the table
    # a seed given twice in a group: which run to pair is unknown, so the group is not paired
    runs.append(_run(tmp_path / "a1dup", "adaptive", 1, 200, [0.2, 0.3, 0.10]))
    assert paired_by_seed(runs)[1:] == ["  planner.strategy=adaptive: run.seed 1 in more than one run; this group is "
                                        "not paired (give each seed once)"]


def test_a_comparison_says_what_a_resume_changed_and_where_a_resume_ran(tmp_path, capsys):
    """config.yaml holds the settings as a run ended: a learning rate changed at a resume read as the same
    settings, and a resume on another machine or dtype was not compared (only the start's environment)."""
    import json

    from rollwise.compare import report_runs
    from rollwise.environment import describe_environment

    a = _run(tmp_path / "uni", "uniform", 0, 100, [0.2, 0.3, 0.4])
    b = _run(tmp_path / "uni2", "uniform", 0, 100, [0.2, 0.35, 0.45])
    env = describe_environment()
    for d in (a, b):
        (d / "environment.json").write_text(json.dumps([{**env, "resumed_from_step": None}]))
    later = {**env, "resumed_from_step": 2, "compute_dtype": "bfloat16",
             "config_changes": {"train.learning_rate": [0.03, 0.003]}}
    (b / "environment.json").write_text(json.dumps([{**env, "resumed_from_step": None}, later]))
    report_runs([a, b], tmp_path / "cmp.png")
    out = capsys.readouterr().out
    assert "the runs' settings are the same as they ended" in out
    assert f"{b}: resumed at step 2 (train.learning_rate: 0.03 -> 0.003)" in out
    assert "computed in different environments" in out and f"{b} (resumed at step 2)" in out


def test_runs_that_differ_only_in_train_size_share_their_generated_held_out_items(tmp_path):
    """Held-out items are drawn before the training items, whatever data.train_size: runs differing in it
    lost their tokens-to-reach as scored on other items. A file task's held-out rows are the tail of its
    seeded shuffle, which the training size does not move either (they were kept apart)."""
    from rollwise.compare import held_out_items

    def folder(name, data):
        d = tmp_path / name
        d.mkdir()
        (d / "config.yaml").write_text(yaml.safe_dump({"run": {"seed": 0}, "data": data}))
        return d

    gen = [{"name": "basic_arithmetic"}]
    assert held_out_items(folder("a", {"tasks": gen, "train_size": 100})) == \
        held_out_items(folder("b", {"tasks": gen, "train_size": 400}))
    assert held_out_items(folder("c", {"tasks": gen, "eval_size": 50})) != \
        held_out_items(folder("d", {"tasks": gen, "eval_size": 80}))
    files = [{"name": "m", "path": "data.jsonl"}]
    assert held_out_items(folder("e", {"tasks": files, "train_size": 100})) == \
        held_out_items(folder("f", {"tasks": files, "train_size": 400}))


def test_a_file_tasks_held_out_rows_do_not_depend_on_the_training_size(tmp_path):
    """What held_out_items relies on: the same rows held out at any data.train_size."""
    from rollwise.config import DataConfig
    from rollwise.data import build_items

    path = tmp_path / "data.jsonl"
    path.write_text("".join(f'{{"prompt": "q{i}", "answer": "{i}"}}\n' for i in range(200)))

    def held_out(train_size):
        cfg = DataConfig.model_validate({"tasks": [{"name": "m", "path": str(path)}], "train_size": train_size,
                                         "eval_size": 20})
        return [it.question for it in build_items(cfg, 0)[1]]

    assert held_out(20) == held_out(150)


def test_a_first_run_evaluated_only_after_training_is_said_to_lack_the_start():
    from rollwise.compare import reach_target

    assert reach_target([(500, 0.4)]) == (None, "has no evaluation before training to measure its gain from")
    assert reach_target([(0, 0.4)]) == (None, "has no evaluation after training")
