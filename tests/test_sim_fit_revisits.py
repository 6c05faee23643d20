"""`rollwise simulate --fit`: the fit's learning law is the simulator's (revisits discounted, each task's
gain split by --transfer), and a run with many answers cut at its length cap is warned of."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from rollwise.sim.fit import first_visits, fit_world
from rollwise.sim.world import SimParams, World


def _write_run(d, lines: list[dict], pps: int, n: int, steps: int, pool: int, cap: int | None = None):
    d.mkdir(parents=True, exist_ok=True)
    rollout = {"prompts_per_step": pps, "num_generations": n, **({"max_completion_length": cap} if cap else {})}
    (d / "config.yaml").write_text(yaml.safe_dump({"rollout": rollout, "train": {"max_steps": steps},
                                                   "data": {"train_size": pool}}))
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [{"step": 0, "eval/accuracy": 0.1}, *lines]))
    return d


def _simulated_run(d, p: SimParams, strategy: str, seed: int, steps: int = 40, pps: int = 16, n: int = 8):
    """A run of `strategy` in the simulator, logged as the training loop logs it (rollout/groups with lengths)."""
    from rollwise.config import PlannerConfig
    from rollwise.planner import build_planner
    from rollwise.sim.runner import play_step

    w = World(p, seed, pps, n)
    planner = build_planner(PlannerConfig(strategy=strategy), w.train_uids, pps, n, p.max_len, seed)
    lengths: dict[str, list[int]] = {}
    generate = w.generate

    def logged(req):
        res = generate(req)
        lengths.setdefault(res.uid, []).extend(res.lengths)
        return res

    w.generate = logged
    lines = []
    for step in range(steps):
        lengths.clear()
        groups, _ = play_step(planner, w, step, False)
        out = planner.end_step()
        w.learn(groups, out.train, out.replay)
        gs = [[uid if p.tasks else f"k0:{uid}", "".join("1" if x else "0" for x in r), lengths[uid]]
              for uid, r in groups.items()]
        lines.append({"step": step + 1, "rollout/rollouts": float(sum(len(g[1]) for g in gs)), "rollout/groups": gs})
    return _write_run(d, lines, pps, n, steps, p.n_train, cap=p.max_len), w


def test_the_signal_before_a_visit_discounts_revisits_as_the_simulator_does(tmp_path) -> None:
    # step 1: a:1 gives 4 effective samples; step 2: a:1 again (its second signal: 0.85 x 4) and b:2 (3);
    # a:3, first seen at step 3, follows 4 + 3.4 + 3 = 10.4 effective samples (n_ref 8), not 11
    d = _write_run(tmp_path / "run", [
        {"step": 1, "rollout/rollouts": 4.0, "rollout/groups": [["a:train:1", "0101", [5] * 4]]},
        {"step": 2, "rollout/rollouts": 8.0, "rollout/groups": [["a:train:1", "0011", [5] * 4],
                                                                ["b:train:2", "0001", [5] * 4]]},
        {"step": 3, "rollout/rollouts": 4.0, "rollout/groups": [["a:train:3", "0110", [5] * 4]]}], 2, 4, 3, 10)
    got = first_visits(d, n_ref=8)
    assert [(v.task, v.step) for v in got] == [("a", 1), ("b", 2), ("a", 3)]
    assert [v.signal for v in got] == pytest.approx([0.0, 4 / 8, 10.4 / 8])
    assert [v.task_signal for v in got] == pytest.approx([0.0, 0.0, 7.4 / 8])  # task a's own part
    assert first_visits(d, n_ref=8, revisit_decay=1.0)[2].signal == pytest.approx(11 / 8)  # a revisit counted in full
    from rollwise.sim.fit import exposure

    # with two tasks and transfer 0.5, a's skill moved by 0.5 X + 0.5 * 2 * X_a
    assert exposure(got[2], 2, 0.5) == pytest.approx(0.5 * 10.4 / 8 + 7.4 / 8)
    assert exposure(got[2], 1, 0.5) == pytest.approx(10.4 / 8)  # one task: X itself


def test_the_fit_recovers_the_learning_rate_of_a_run_that_revisits(tmp_path) -> None:
    # adaptive on a 400-prompt pool revisits prompts from its first steps: counted in full, their signal
    # made lr read 17% low (0.250 for 0.3 over 8 seeds); discounted as the simulator does, 0.301. The
    # seeds here: 0.269 discounted, 0.222 in full (a seed's SE is about 0.03)
    p = SimParams(n_train=400, skill0=-1.5, difficulty_sd=1.0, unsolvable=0.0, lr=0.3, drift=0.0)
    runs = [_simulated_run(tmp_path / f"s{seed}", p, "adaptive", seed)[0] for seed in range(4)]
    discounted = [fit_world(first_visits(d, n_ref=128), unsolvable=0.0, growth=False).learning for d in runs]
    assert abs(np.mean(discounted) - 0.3) < 0.04, discounted
    full = [fit_world(first_visits(d, n_ref=128, revisit_decay=1.0), unsolvable=0.0, growth=False).learning
            for d in runs]
    assert np.mean(full) < np.mean(discounted) - 0.03, (full, discounted)


def test_the_tasks_spread_is_read_with_each_tasks_own_learning(tmp_path) -> None:
    # the simulator gives the tasks trained on (1 - transfer) of a step's gain in proportion to their signal, so
    # a hard task learns slower; one gain for every task read it harder still and the tasks' sd 0.13 too wide
    p = SimParams(n_train=400, skill0=-1.5, difficulty_sd=1.0, unsolvable=0.0, lr=0.3, drift=0.0, tasks=4, task_sd=0.5)
    errors = []
    for seed in range(4):
        d, w = _simulated_run(tmp_path / f"s{seed}", p, "uniform", seed)
        fit = fit_world(first_visits(d, n_ref=128), unsolvable=0.0, growth=False)
        truth = [p.skill0 - w.b[: p.n_train][w.task[: p.n_train] == t].mean() for t in range(4)]
        errors.append(fit.task_sd - np.std(truth, ddof=1))
    assert abs(np.mean(errors)) < 0.05, errors


def _cut_run(tmp_path, cut_every: int, with_lengths: bool = True):
    """80 first visits of 8 over 5 steps; every cut_every-th sample at the 64-token cap (scored wrong)."""
    rng = np.random.default_rng(0)
    lines, i = [], 0
    for step in range(1, 6):
        gs = []
        for k in range(16):
            out, lens = "", []
            for _ in range(8):
                i += 1
                cut = i % cut_every == 0
                out += "0" if cut or rng.random() > 0.4 else "1"
                lens.append(64 if cut else int(rng.integers(5, 60)))
            gs.append([f"gcd:train:{step}-{k}", out, *([lens] if with_lengths else [])])
        share = sum(x == 64 for g in gs for x in (g[2] if with_lengths else [])) / 128 if with_lengths else 1 / cut_every
        lines.append({"step": step, "rollout/rollouts": 128.0, "rollout/truncated_frac": share, "rollout/groups": gs})
    return _write_run(tmp_path, lines, 16, 8, 5, 200, cap=64)


def test_the_share_cut_at_the_length_cap_is_measured_and_warned_of(tmp_path, capsys) -> None:
    from test_sim_audit import parsed

    d = _cut_run(tmp_path / "cut", 4)  # a quarter of the samples cut
    args = parsed("--fit", str(d), "--unsolvable", "0", "--strategies", "uniform", "--seeds", "1", "--steps", "2", "--eval-size", "16",
                  "--out", str(tmp_path / "sim"))
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert "cut at the length cap: 25.0% of the first visits' samples fitted" in captured.out
    assert ("warning: 25% of the first visits' samples fitted were cut at rollout.max_completion_length"
            in captured.err), captured.err
    assert "larger rollout.max_completion_length" in captured.err
    fit = json.loads((tmp_path / "sim" / "results.json").read_text())["fit"]
    assert fit["truncated"] == pytest.approx(0.25) and fit["truncated_from"] == "lengths"
    from rollwise.sim.fit import cut_share

    visits = first_visits(d)
    assert sum(v.cut for v in visits) == 160 and cut_share(visits) == pytest.approx((0.25, 640))
    # a run that logged no lengths: its rollout/truncated_frac says it
    old = _cut_run(tmp_path / "old", 5, with_lengths=False)
    args = parsed("--fit", str(old), "--unsolvable", "0", "--strategies", "uniform", "--seeds", "1", "--steps", "2", "--eval-size", "16",
                  "--out", str(tmp_path / "sim2"), "--quiet")
    assert args.func(args) == 0
    assert "warning: 20% of the samples in the steps fitted (rollout/truncated_frac" in capsys.readouterr().err
    # few cut: no warning
    few = _cut_run(tmp_path / "few", 20)
    args = parsed("--fit", str(few), "--unsolvable", "0", "--strategies", "uniform", "--seeds", "1", "--steps", "2", "--eval-size", "16",
                  "--out", str(tmp_path / "sim3"), "--quiet")
    assert args.func(args) == 0
    assert "max_completion_length" not in capsys.readouterr().err


def test_simulate_fit_reads_the_learning_rate_under_the_revisit_decay_it_simulates(tmp_path, capsys) -> None:
    from test_sim_audit import parsed

    p = SimParams(n_train=400, skill0=-1.5, difficulty_sd=1.0, unsolvable=0.0, lr=0.3, drift=0.0)
    d, _ = _simulated_run(tmp_path / "run", p, "adaptive", 0)
    lrs, said = {}, {}
    for decay in ("0.85", "1"):
        out = tmp_path / f"sim{decay}"
        args = parsed("--fit", str(d), "--revisit-decay", decay, "--unsolvable", "0", "--strategies", "uniform",
                      "--seeds", "1", "--steps", "2", "--eval-size", "16", "--out", str(out))
        assert args.func(args) == 0
        said[decay] = capsys.readouterr().out
        lrs[decay] = json.loads((out / "results.json").read_text())["fit"]["learning"]
    assert lrs["1"] < lrs["0.85"] - 0.01, lrs  # revisits counted in full: less skill per effective sample
    assert all(f"count a prompt's k-th signal {float(k):g}^k" in text for k, text in said.items())
    bad = parsed("--fit", str(d), "--revisit-decay", "1.5", "--out", str(tmp_path / "bad"), "--quiet")
    assert bad.func(bad) == 2
    assert "--revisit-decay is a factor in [0, 1]" in capsys.readouterr().err
