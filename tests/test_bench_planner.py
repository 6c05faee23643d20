"""bench/planner.py's share on the mean curve (bench/preregistered/adaptive_seeds58.txt), hand-computed."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("planner_bench", Path(__file__).parents[1] / "bench" / "planner.py")
planner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(planner)


def runs(**points):
    return {int(seed[1:]): {"points": p} for seed, p in points.items()}


def test_mean_curve_share_interpolates_normalised_curves():
    # uniform: seed 1 from 0.2 to 0.3 over 100 tokens, seed 2 from 0.2 to 0.38 over 200: mean final 0.34
    uni = runs(s1=[(0, 0.2), (100, 0.3)], s2=[(0, 0.2), (200, 0.38)])
    # the other arm, x = tokens / that seed's uniform total: seed 1 reaches 0.4 at x 0.5 and holds it
    # (its last evaluation), seed 2 0.3 at x 0.5 and holds it: the mean is 0.2 + 0.3x up to x 0.5
    other = runs(s1=[(0, 0.2), (50, 0.4)], s2=[(0, 0.2), (100, 0.3), (200, 0.3)])
    m = planner.mean_curve(uni, other, [1, 2])
    assert m[0] == pytest.approx(0.2) and m[100] == pytest.approx(0.35) and m[-1] == pytest.approx(0.35)
    share, lo, hi, n = planner.mean_curve_share(uni, other, reps=200)
    assert share == pytest.approx(0.14 / 0.3) and n == 2  # 0.2 + 0.3x = 0.34
    assert lo <= share <= hi
    # an arm that stays below uniform's mean final never reaches it, in every resample too
    flat = runs(s1=[(0, 0.2), (100, 0.25)], s2=[(0, 0.2), (200, 0.25)])
    share, lo, hi, _ = planner.mean_curve_share(uni, flat, reps=50)
    assert math.isinf(share) and planner.fmt_share(share) == "never" and planner.fmt_share(hi) == "never"
    # uniform against itself reaches its own mean final exactly at its end
    assert planner.mean_curve_share(uni, uni, reps=10)[0] == pytest.approx(1.0)


def test_a_budgeted_runs_final_is_read_at_uniforms_tokens_and_reaching_past_them_is_never():
    # uniform ends at 0.30 after 1,000 tokens; the arm was at 0.28 after 900 and, with the step that
    # crossed the budget, at 0.31 after 1,080: at uniform's tokens it is at 0.28 + 0.03 * 100/180
    pb = planner
    uni = {1: {"points": [[0, 0.2], [1000, 0.30]]}}
    arm = {1: {"points": [[0, 0.2], [900, 0.28], [1080, 0.31]]}}
    assert pb.at_tokens(arm[1]["points"], 1000) == pytest.approx(0.28 + 0.03 * 100 / 180)
    assert pb.at_tokens([[0, 0.2], [800, 0.25]], 1000) == 0.25  # ended before: its last evaluation
    assert pb.share_to_reach(arm[1]["points"], 0.30, 1000) == float("inf")  # reached only past the budget
    assert pb.share_to_reach(arm[1]["points"], 0.28, 1000) == pytest.approx(0.9)
    cells = pb.paired_summary(uni, arm).split(" | ")
    assert cells[1].startswith("-0.3 ") and cells[2] == "0 of 1" and cells[3] == "never"
    assert cells[5] == "never (n=1) |"  # one seed: no interval


def test_first_crossing_is_linear_between_grid_points():
    m = planner.GRID * 0.5  # 0 -> 0.5
    assert planner.first_crossing(m, 0.2013) == pytest.approx(0.4026)
    assert planner.first_crossing(m, 0.0) == 0.0
    assert math.isinf(planner.first_crossing(m, 0.6))


def test_length_gap_reads_groups_with_both_outcomes(tmp_path):
    import json

    spec = importlib.util.spec_from_file_location("length_gap", Path(__file__).parents[1] / "bench" / "length_gap.py")
    gap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gap)
    run = tmp_path / "adaptive-seed1"
    run.mkdir()
    rows = [{"step": 0, "eval/response_len_mean": 30.0},
            {"step": 1, "rollout/groups": [["a", "0110", [10, 4, 6, 20]], ["b", "11", [1, 1]], ["c", "01"]]},
            {"step": 2, "rollout/groups": [["d", "10", [8, 2]]], "eval/response_len_mean": 12.0}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = gap.run_gap(run)  # a: correct 5, wrong 15 (-10); d: +6; b all correct, c without lengths: left out
    assert got["groups"] == 2 and got["gap"] == pytest.approx(-2.0)
    assert got["correct"] == pytest.approx((4 + 6 + 8) / 3) and got["wrong"] == pytest.approx((10 + 20 + 2) / 3)
    assert got["answers"] == (30.0, 12.0)


def test_early_stop_replay_stops_where_the_loop_would(tmp_path, capsys):
    import json

    spec = importlib.util.spec_from_file_location("early_stop", Path(__file__).parents[1] / "bench" / "early_stop.py")
    es = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(es)
    run = tmp_path / "adaptive-seed1"
    run.mkdir()
    accs = {0: 0.2, 3: 0.3, 6: 0.25, 9: 0.28, 12: 0.35}  # evaluations; 12 is the last step (the final one)
    rows = [{"step": s, "rollout/tokens_total": 100 * s} for s in range(1, 13)]
    rows += [{"step": s, "eval/accuracy": a} for s, a in accs.items()]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in sorted(rows, key=lambda r: r["step"])) + "\n")
    one = es.replay(run, patience=1)  # 0.25 at step 6 does not beat 0.3: stop there, with 600 of 1200 tokens
    assert one == {"stopped": 1.0, "share": 0.5, "at_stop": 0.25, "best": 0.3, "final": 0.35}
    two = es.replay(run, patience=2)  # 0.28 at step 9 is the second miss
    assert two["stopped"] == 1.0 and two["share"] == 0.75 and two["at_stop"] == 0.28
    assert es.replay(run, patience=3) == {"stopped": 0.0, "share": 1.0, "at_stop": 0.35, "best": 0.35, "final": 0.35}
    assert es.main([str(tmp_path), "--patience", "1"]) == 0
    assert "| 1 | 1 of 1 | 0.50 |" in capsys.readouterr().out
    assert es.main([str(tmp_path), "--arm", "uniform"]) == 2


def test_report_names_its_files_by_whether_it_covers_every_run(tmp_path, capsys):
    import json

    for strategy, seed, points in [("uniform", 1, [[0, 0.2], [100, 0.3]]), ("adaptive", 1, [[0, 0.2], [40, 0.35]]),
                                   ("uniform", 2, [[0, 0.2], [100, 0.25]]), ("adaptive", 2, [[0, 0.2], [90, 0.3]])]:
        d = tmp_path / f"{strategy}-seed{seed}"
        d.mkdir()
        (d / "curve.json").write_text(json.dumps({"points": points, "steps": 3, "effective_ratio": 0.5,
                                                  "answer_length": [30.0, 20.0], "strategy": strategy, "seed": seed}))
    assert planner.report(tmp_path) == 0
    assert (tmp_path / "table.md").is_file() and (tmp_path / "mean-curves.png").is_file()
    assert "| 1 | 30.0% (100) | 35.0% | 0.40 |" in (tmp_path / "table.md").read_text()
    assert planner.report(tmp_path, seeds=[1]) == 0  # a subset writes its own files
    assert "| 2 |" not in (tmp_path / "table-selection.md").read_text()
    assert "| 2 |" in (tmp_path / "table.md").read_text()
    capsys.readouterr()


def test_sim_vs_real_reads_both_kinds_of_results(tmp_path, capsys):
    import json

    spec = importlib.util.spec_from_file_location("sim_vs_real", Path(__file__).parents[1] / "bench" / "sim_vs_real.py")
    svr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(svr)
    # two identical seeds: uniform 0.2 -> 0.3 over 100 tokens; adaptive 0.3 at 50 and 0.35 at 100
    uni, ad = [[0, 0.2], [100, 0.3]], [[0, 0.2], [50, 0.3], [100, 0.35]]
    real = tmp_path / "real"
    real.mkdir()
    (real / "results.json").write_text(json.dumps({"uniform": {"1": {"points": uni}, "2": {"points": uni}},
                                                   "adaptive": {"1": {"points": ad}, "2": {"points": ad}}}))
    got = svr.leads(*svr.load(real, "adaptive"))
    # in units of uniform's gain (0.1): at x 0.25 0.25 - 0.225, at 0.5 0.3 - 0.25, at 1 0.35 - 0.3
    assert got["gain"] == pytest.approx(0.1) and got["seeds"] == 2
    assert [m for m, _ in got["leads"].values()] == pytest.approx([0.25, 0.5, 0.5, 0.5])
    assert got["share"] == pytest.approx(0.5)
    # a simulator's results.json: its unit (rollouts here) is the x axis, tokens are ignored
    sim = tmp_path / "sim"
    sim.mkdir()

    def run(seed, pts):
        return {"seed": seed, "curve": {"rollouts": [p[0] for p in pts], "tokens": [0.0] * len(pts),
                                        "accuracy": [p[1] for p in pts]}}

    (sim / "results.json").write_text(json.dumps({"args": {"unit": "rollouts"}, "runs": {
        "uniform": [run(1, uni), run(2, uni)], "adaptive": [run(1, ad), run(2, ad)]}}))
    assert [m for m, _ in svr.leads(*svr.load(sim, "adaptive"))["leads"].values()] == pytest.approx([0.25, 0.5, 0.5, 0.5])
    assert svr.main([str(real), str(sim / "results.json")]) == 0
    assert "| +0.25 (0.00) | +0.50 (0.00)" in capsys.readouterr().out


def test_eval_lengths_compares_two_arms_at_shares_of_the_reference_tokens(tmp_path):
    import json

    spec = importlib.util.spec_from_file_location("eval_lengths", Path(__file__).parents[1] / "bench" / "eval_lengths.py")
    el = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(el)

    def run(name, rows):
        d = tmp_path / name
        d.mkdir()
        (d / "curve.json").write_text("{}")
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    # reference: 0 -> 100 tokens, accuracy 0.2 -> 0.4, length 40 -> 20, cut 0.5 -> 0.1
    run("adaptive-seed1", [{"step": 0, "eval/accuracy": 0.2, "eval/response_len_mean": 40.0, "eval/truncated_frac": 0.5},
                           {"step": 4, "rollout/tokens_total": 100.0, "eval/accuracy": 0.4,
                            "eval/response_len_mean": 20.0, "eval/truncated_frac": 0.1}])
    # the arm reaches 0.5 at 50 tokens and holds it; no cut share logged at its end
    run("adaptive+revisit_discount-0.7-seed1", [
        {"step": 0, "eval/accuracy": 0.2, "eval/response_len_mean": 40.0, "eval/truncated_frac": 0.5},
        {"step": 2, "rollout/tokens_total": 50.0, "eval/accuracy": 0.5, "eval/response_len_mean": 10.0}])
    lines = el.table(tmp_path, "adaptive:revisit_discount=0.7", against="adaptive")
    half = next(row for row in lines if row.startswith("| 0.5 |")).split(" | ")
    assert half[1:4] == ["30.0%", "30.0", "30.0%"]  # the reference at 50 of its 100 tokens
    assert half[4:7] == ["50.0%", "10.0", "-"]  # the arm at 50 tokens; its cut share is not known there
    with pytest.raises(SystemExit, match="no seed with both a finished uniform"):
        el.table(tmp_path, "adaptive")


def test_breadth_pairs_an_arms_prompts_trained_with_its_lead_over_uniform(tmp_path):
    import json

    spec = importlib.util.spec_from_file_location("breadth", Path(__file__).parents[1] / "bench" / "breadth.py")
    br = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(br)

    def run(name, rows, finished=True):
        d = tmp_path / name
        d.mkdir()
        if finished:
            (d / "curve.json").write_text("{}")
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    run("uniform-seed1", [{"step": 0, "eval/accuracy": 0.2}, {"step": 4, "eval/accuracy": 0.3}])
    run("adaptive+score_per_token-true-seed1", [{"step": 0, "eval/accuracy": 0.2},
                                                {"step": 1, "planner/prompts_trained": 3.0},
                                                {"step": 2, "planner/prompts_trained": 7.0, "eval/accuracy": 0.25}])
    run("adaptive+score_per_token-true-seed2", [{"step": 0, "eval/accuracy": 0.2}], finished=False)
    (seed, trained, lead), = br.leads(tmp_path, "adaptive:score_per_token=true")
    assert (seed, trained) == ("1", 7.0) and lead == pytest.approx(-5.0)


def test_breadth_cut_shares_average_training_steps_1_to_6_and_take_the_last_evaluation(tmp_path):
    spec = importlib.util.spec_from_file_location("breadth", Path(__file__).parents[1] / "bench" / "breadth.py")
    br = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(br)
    import json

    rows = [{"step": 0, "eval/accuracy": 0.2, "eval/truncated_frac": 0.5}]
    rows += [{"step": s, "rollout/truncated_frac": 0.1 * s} for s in range(1, 9)]  # steps 7-8 not counted
    rows += [{"step": 8, "eval/accuracy": 0.3, "eval/truncated_frac": 0.25}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    early, held = br.cuts(tmp_path)
    assert early == pytest.approx(0.35) and held == 0.25


def test_share_to_uniforms_peak_and_uniforms_gain():
    # uniform rises 0.2 -> 0.4 at half its tokens, then falls back to 0.3: the peak bar is 0.4
    uni = runs(s1=[(0, 0.2), (50, 0.4), (100, 0.3)], s2=[(0, 0.2), (100, 0.4), (200, 0.3)])
    other = runs(s1=[(0, 0.2), (100, 0.45)], s2=[(0, 0.2), (200, 0.45)])  # 0.2 + 0.25x
    assert planner.mean_curve_share(uni, other, reps=20)[0] == pytest.approx(0.1 / 0.25)  # to 0.3
    assert planner.mean_curve_share(uni, other, reps=20, target="best")[0] == pytest.approx(0.2 / 0.25)  # to 0.4
    gain, se = planner.uniform_gain(uni)
    assert gain == pytest.approx(0.1) and se == pytest.approx(0.0)
    rows = planner.against_best(uni, {"uniform": uni, "x": other})
    assert rows[0].startswith("Uniform's gain over its start: +10.0 points (SE 0.0) over 2 seeds")
    assert "peaks at 40.0% (share 0.50), ends at 30.0%" in rows[0]
    assert rows[-1] == "| x | 0.80 (n=2) |"  # two seeds: no interval
