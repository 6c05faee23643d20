import re
from pathlib import Path

import pytest

from rollwise.config import ConfigError, build_config, describe_fields, load_config, parse_overrides, unused_settings


def test_defaults_are_valid():
    cfg = load_config()
    assert cfg.model.name_or_path == "smollm2-135m"
    assert cfg.rollout.num_generations == 8


def test_dotted_overrides_parse_yaml_values():
    cfg = load_config(None, ["algo.beta=0.04", "algo.loss_type=grpo", "rollout.temperature=0.7", "model.lora.enabled=true"])
    assert cfg.algo.beta == 0.04 and cfg.algo.loss_type == "grpo"
    assert cfg.rollout.temperature == 0.7 and cfg.model.lora.enabled is True


def test_unknown_key_names_key_and_suggests():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.loss_typ=grpo"])
    msg = str(e.value)
    assert "algo.loss_typ" in msg and "Did you mean 'algo.loss_type'" in msg


def test_unknown_section():
    with pytest.raises(ConfigError, match="unknown config key 'algorithm'"):
        load_config(None, ["algorithm.beta=1"])


def test_bad_literal_lists_allowed_values():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.loss_type=foo"])
    assert "algo.loss_type" in str(e.value) and "'dapo'" in str(e.value)


def test_wrong_type_and_impossible_values():
    with pytest.raises(ConfigError, match="rollout.num_generations"):
        load_config(None, ["rollout.num_generations=abc"])
    with pytest.raises(ConfigError, match="rollout.num_generations"):
        load_config(None, ["rollout.num_generations=0"])
    with pytest.raises(ConfigError, match="epsilon_high"):
        load_config(None, ["algo.epsilon=0.3", "algo.epsilon_high=0.2"])
    with pytest.raises(ConfigError, match="unknown reward"):
        load_config(None, ["reward.functions=[{name: nope}]"])
    # inf and NaN pass a bound like gt=0 and then ruin the run (lr=inf trained to NaN weights, exit 0)
    for key in ("train.learning_rate=.inf", "rollout.temperature=.inf", "reward.truncated_reward=.nan",
                "planner.success_threshold=.nan", "train.learning_rate=nan"):
        with pytest.raises(ConfigError, match=key.split("=")[0].split(".")[-1] + ".*finite"):
            load_config(None, [key])
    for name in ("../../x", "/tmp/x", " "):  # a run folder outside run.output_dir
        with pytest.raises(ConfigError, match="run.name.*inside run.output_dir"):
            load_config(None, [f"run.name={name}"])
    assert load_config(None, ["run.name=sweep/seed1"]).run.name == "sweep/seed1"  # a folder of runs is fine
    with pytest.raises(ConfigError, match="weight.*finite"):
        load_config(None, ["reward.functions=[{name: reasoning_gym}, {name: format, weight: .nan}]"])


def test_empty_lists_and_contradictory_settings_stop_before_the_model_loads():
    with pytest.raises(ConfigError, match="reward.functions.*at least 1"):
        load_config(None, ["reward.functions=[]"])
    with pytest.raises(ConfigError, match="data.tasks.*at least 1"):
        load_config(None, ["data.tasks=[]"])
    with pytest.raises(ConfigError, match="both set; a step's budget is in one unit"):
        load_config(None, ["planner.budget_rollouts=32", "planner.budget_tokens=2000"])
    with pytest.raises(ConfigError, match=r"min_samples_per_prompt \(20\) must be <= planner.max_samples_per_prompt"):
        load_config(None, ["planner.strategy=knapsack", "planner.min_samples_per_prompt=20",
                           "planner.max_samples_per_prompt=4"])
    with pytest.raises(ConfigError, match="greso_explore_min"):
        load_config(None, ["planner.strategy=greso", "planner.greso_explore_min=0.9", "planner.greso_explore_max=0.1"])
    # a check across sections says what is wrong, without dumping the whole config
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.epsilon_high=0.1"])
    assert "(got {" not in str(e.value) and "Value error" not in str(e.value) and len(str(e.value)) < 200


def test_yaml_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algo:\n  beta: 0.1\ntrain:\n  max_steps: 3\n")
    cfg = load_config(p, ["train.max_steps=5"])
    assert cfg.algo.beta == 0.1 and cfg.train.max_steps == 5
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(p)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_overrides(["algo.beta"])
    for item in ("data.tasks.0.weight=2", "data.tasks[0].weight=2"):  # was "not a valid list" / "unknown key"
        with pytest.raises(ConfigError, match=r"a list's items cannot be set one by one; give data.tasks whole"):
            parse_overrides([item])


def test_a_config_file_that_is_not_utf8_is_named(tmp_path):
    (tmp_path / "win.yaml").write_bytes("train:\n  max_steps: 3\n".encode("utf-16"))  # PowerShell's `>`
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(tmp_path / "win.yaml")


def test_a_text_option_keeps_the_text_as_typed():
    # read as YAML, ` #...` would be cut as a comment, `a: b` read as a mapping, a date as a date
    cfg = load_config(None, ["data.instruction=End with #### and the number.", "run.name=2024-11-30",
                             "model.name_or_path=./out #2", "run.output_dir=001"])
    assert cfg.data.instruction == "End with #### and the number."
    assert (cfg.run.name, cfg.model.name_or_path, cfg.run.output_dir) == ("2024-11-30", "./out #2", "001")
    assert load_config(None, ["data.instruction=Final answer format: \\boxed{N}"]).data.instruction == \
        "Final answer format: \\boxed{N}"
    assert load_config(None, ["run.name=null"]).run.name is None  # None where None is allowed
    assert load_config(None, ["run.name='a #b'"]).run.name == "a #b"  # quoted: YAML, as before
    # other options are still YAML: numbers, booleans, lists
    cfg = load_config(None, ["algo.beta=0.04", "run.progress=false", "train.max_steps=3"])
    assert (cfg.algo.beta, cfg.run.progress, cfg.train.max_steps) == (0.04, False, 3)


def test_a_section_given_twice_in_a_config_file_is_an_error_not_a_silent_drop(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  max_steps: 100\nalgo:\n  beta: 0.0\ntrain:\n  micro_batch_size: 4\n")
    with pytest.raises(ConfigError, match=r"'train' is given twice in one section \(lines 1 and 5\)"):
        load_config(p)
    p.write_text("train:\n  max_steps: 100\n  max_steps: 3\n")
    with pytest.raises(ConfigError, match="'max_steps' is given twice"):
        load_config(p)


@pytest.mark.parametrize("override", ["run.seed=-1", "planner.seed=-3", "run.seed=4294967296"])
def test_a_seed_numpy_cannot_take_is_a_config_error(override):
    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_config(None, [override])


def test_every_field_is_documented():
    rows = describe_fields()
    assert len(rows) > 40
    assert all(desc for _, _, desc in rows), [k for k, _, d in rows if not d]


def test_options_doc_is_in_sync(capsys):
    from pathlib import Path

    from rollwise.cli import main

    doc = (Path(__file__).parents[1] / "docs" / "options.md").read_text()
    for key, default, desc in describe_fields():
        assert f"| `{key}` | `{default}` | {desc} |" in doc, f"docs/options.md is stale for {key}: run make docs"
    assert main(["options", "--markdown"]) == 0  # what make docs runs
    table = capsys.readouterr().out
    assert table.startswith("| key | default | meaning |") and doc.rstrip().endswith(table.rstrip())


def test_shipped_configs_are_valid_and_default_yaml_matches_builtin():
    from pathlib import Path

    root = Path(__file__).parents[1] / "configs"
    for f in sorted(root.glob("*.yaml")):
        load_config(f)
    assert load_config(root / "default.yaml") == load_config()


def test_offpolicy_correction_is_validated_against_the_registry():
    from typing import get_args

    from rollwise.algos import OFFPOLICY_CORRECTIONS
    from rollwise.config import AlgoConfig

    names = get_args(AlgoConfig.model_fields["offpolicy_correction"].annotation)
    assert set(names) == set(OFFPOLICY_CORRECTIONS)  # the config offers exactly what the trainer can look up
    assert load_config().algo.offpolicy_correction == "recompute"
    cfg = load_config(None, ["algo.offpolicy_correction=icepop", "algo.icepop_low=0.25", "algo.icepop_high=4"])
    assert (cfg.algo.offpolicy_correction, cfg.algo.icepop_low, cfg.algo.icepop_high) == ("icepop", 0.25, 4.0)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.offpolicy_correction=importance_sampling"])
    msg = str(e.value)
    assert "algo.offpolicy_correction" in msg and "'importance_sampling'" in msg
    assert all(f"'{n}'" in msg for n in OFFPOLICY_CORRECTIONS), msg  # the allowed names are listed
    with pytest.raises(ConfigError, match="algo.tis_cap"):
        load_config(None, ["algo.tis_cap=0"])
    with pytest.raises(ConfigError, match="icepop_low"):
        load_config(None, ["algo.icepop_low=3"])  # above the default high of 2


def test_executor_options_need_the_continuous_engine():
    with pytest.raises(ConfigError, match="rollout.engine=continuous"):
        load_config(None, ["rollout.engine=hf", "rollout.partial_rollouts=true"])
    with pytest.raises(ConfigError, match="top_p=1"):
        load_config(None, ["rollout.speculative_reuse=true", "rollout.top_p=0.9"])
    cfg = load_config(None, ["rollout.partial_rollouts=true", "rollout.speculative_reuse=true"])
    assert cfg.rollout.engine == "continuous"


def test_rollout_workers_refuse_what_they_cannot_do_yet():
    for flag in ("partial_rollouts", "speculative_reuse"):
        with pytest.raises(ConfigError, match=f"rollout.{flag}=true is not supported with rollout workers"):
            load_config(None, ["distributed.async_training=true", f"rollout.{flag}=true"])
    with pytest.raises(ConfigError, match="continuous or vllm"):
        load_config(None, ["distributed.backend=ray", "rollout.engine=hf"])
    with pytest.raises(ConfigError, match="max_staleness"):
        load_config(None, ["distributed.max_staleness=-1"])
    for extra in ([], ["distributed.async_training=true"]):  # local workers would only take turns
        with pytest.raises(ConfigError, match="rollout_workers=2 needs distributed.backend=ray"):
            load_config(None, ["distributed.rollout_workers=2", *extra])
    assert load_config(None, ["distributed.rollout_workers=2", "distributed.backend=ray"]).distributed.rollout_workers == 2
    cfg = load_config(None, ["distributed.async_training=true", "distributed.backend=ray"])
    assert cfg.distributed.rollout_workers == 1 and cfg.distributed.max_staleness == 1


def test_engine_dtype_auto_follows_the_model_except_for_speculative_reuse():
    import torch

    from rollwise.engine.factory import engine_dtype

    assert engine_dtype(load_config(None, ["model.dtype=bfloat16"])) == torch.bfloat16
    assert engine_dtype(load_config(None, ["model.dtype=bfloat16", "rollout.speculative_reuse=true"])) == torch.float32
    assert engine_dtype(load_config(None, ["model.dtype=bfloat16", "rollout.engine_dtype=float32"])) == torch.float32
    cfg = load_config(None, ["rollout.speculative_reuse=true", "rollout.engine_dtype=bfloat16"])
    assert engine_dtype(cfg) == torch.bfloat16


def test_dtype_auto_is_bf16_only_where_the_hardware_computes_it(monkeypatch):
    import torch

    from rollwise import models
    from rollwise.engine.factory import engine_dtype

    assert load_config(None, []).model.dtype == "auto"
    monkeypatch.setattr(models, "native_bf16", lambda device="cpu": False)  # an AVX2-only CPU
    assert models.compute_dtype("auto") == torch.float32
    assert engine_dtype(load_config(None, [])) == torch.float32
    assert models.compute_dtype("bfloat16") == torch.bfloat16  # an explicit choice is kept ...
    assert "model.dtype=auto" in models.slow_dtype_warning("bfloat16")  # ... with a warning
    assert models.slow_dtype_warning("float32") is None
    monkeypatch.setattr(models, "native_bf16", lambda device="cpu": True)  # AVX-512 / AMX / Arm bf16
    assert models.compute_dtype("auto") == torch.bfloat16
    assert engine_dtype(load_config(None, [])) == torch.bfloat16
    assert engine_dtype(load_config(None, ["rollout.speculative_reuse=true"])) == torch.float32
    assert models.slow_dtype_warning("bfloat16") is None
    with pytest.raises(ValueError, match="allowed: auto"):
        models.compute_dtype("int8")


def test_native_bf16_on_a_cpu_needs_a_bf16_instruction(monkeypatch):
    import torch

    from rollwise import models

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(models, "cpu_flags", lambda: {"avx2", "avx512f", "avx512bw"})  # Ice Lake: emulated
    assert not models.native_bf16("cpu")
    assert models.compute_dtype("auto") == torch.float32
    monkeypatch.setattr(models, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})  # Zen 4, Cooper Lake
    assert models.native_bf16("cpu")
    monkeypatch.setattr(models, "cpu_flags", lambda: {"amx_bf16", "amx_tile"})  # Sapphire Rapids
    assert models.native_bf16("cpu")
    monkeypatch.setattr(models, "cpu_flags", lambda: {"asimd", "bf16"})  # Arm with the BF16 extension
    assert models.native_bf16("cpu")
    monkeypatch.setattr(models, "cpu_flags", lambda: None)  # no /proc/cpuinfo: torch's check decides
    assert models.native_bf16("cpu")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(models, "cpu_flags", lambda: {"avx512_bf16"})
    assert not models.native_bf16("cpu")


def test_an_emulated_bf16_is_said_once_before_training(monkeypatch, capsys):
    from rollwise import models
    from rollwise.loop import warn_slow_dtype

    monkeypatch.setattr(models, "native_bf16", lambda device="cpu": False)
    warn_slow_dtype(load_config(None, ["model.dtype=bfloat16"]))
    assert "rollwise: warning: model.dtype=bfloat16" in capsys.readouterr().err
    warn_slow_dtype(load_config(None, []))  # auto never warns
    assert capsys.readouterr().err == ""


def test_a_gpu_left_idle_is_said_before_training(monkeypatch, capsys):
    import torch

    from rollwise.loop import warn_idle_gpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    warn_idle_gpu(load_config(None, []))
    assert capsys.readouterr().err == ""  # no GPU: nothing to say
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    warn_idle_gpu(load_config(None, []))
    assert "NVIDIA H200 is available but model.device=cpu; set model.device=cuda" in capsys.readouterr().err
    warn_idle_gpu(load_config(None, ["model.device=cuda"]))
    assert capsys.readouterr().err == ""


def test_transpose_weights_is_refused_for_vllm_and_reaches_the_engine(tiny_model_dir):
    import torch

    from rollwise.engine.factory import build_engine
    from rollwise.engine.hf import input_major
    from rollwise.models import load_model

    with pytest.raises(ConfigError, match="transpose_weights=true applies to the hf and continuous"):
        load_config(overrides=["rollout.engine=vllm", "rollout.transpose_weights=true"])
    load_config(overrides=["rollout.engine=vllm"])  # unset: nothing to refuse
    model = load_model(str(tiny_model_dir), torch.float32)
    for engine in ("continuous", "hf"):
        for setting, expect in (("null", True), ("false", False), ("true", True)):
            cfg = load_config(overrides=[f"rollout.engine={engine}", f"rollout.transpose_weights={setting}",
                                         "model.dtype=float32"])
            assert input_major(build_engine(cfg, model, [0], 0, seed=0).model) is expect, (engine, setting)
    cfg = load_config(overrides=["rollout.engine_dtype=bfloat16"])  # unset in bf16: off (measured no faster)
    assert not input_major(build_engine(cfg, model, [0], 0, seed=0).model)


def test_a_planner_option_no_part_reads_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="screen_followup=next_step is read only by planner.allocator=screen"):
        build_config({"planner": {"strategy": "uniform", "screen_followup": "next_step"}})
    cfg = build_config({"planner": {"strategy": "mopps", "allocator": "screen", "screen_growth": "eager"}})
    assert cfg.planner.screen_growth == "eager"
    with pytest.raises(ConfigError, match="estimator_window=8 is read only by planner.estimator=window or last_visit"):
        build_config({"planner": {"estimator_window": 8}})  # adaptive's estimator is irt
    # dapo rolls out and filters without reading its window estimator: the option changes only planner/brier, a
    # warning (an error would refuse to resume runs made so, and comparing estimators' Brier scores is a use)
    dapo = build_config({"planner": {"strategy": "dapo", "estimator_window": 32}})
    assert any("estimator_window shapes the estimator's belief" in w and "'dapo'" in w for w in unused_settings(dapo))
    uni = build_config({"planner": {"strategy": "uniform", "estimator": "beta"}})
    assert any(w.startswith("planner.estimator=beta shapes") for w in unused_settings(uni))
    assert not any("shapes" in w for w in unused_settings(build_config({"planner": {"strategy": "knapsack",
                                                                                    "estimator_window": 32}})))
    with pytest.raises(ConfigError, match="target_solve_rate=0.3 is read only by planner.selector=posterior with "
                                          "planner.selection_score=target; strategy 'adaptive' scores"):
        build_config({"planner": {"target_solve_rate": 0.3}})  # adaptive scores by expected signal
    with pytest.raises(ConfigError, match="strategy 'knapsack' uses selector 'all'"):
        build_config({"planner": {"strategy": "knapsack", "target_solve_rate": 0.3}})
    assert build_config({"planner": {"strategy": "mopps", "target_solve_rate": 0.3}}).planner.target_solve_rate == 0.3
    assert build_config({"planner": {"posterior_decay": 0.8}}).planner.posterior_decay == 0.8  # irt reads it


def test_planner_options_another_option_switches_off_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="candidate_factor=1 gives the posterior selector no more candidates"):
        build_config({"planner": {"strategy": "mopps", "candidate_factor": 1, "selection_score": "info"}})
    assert build_config({"planner": {"strategy": "mopps", "candidate_factor": 1}}).planner.candidate_factor == 1
    with pytest.raises(ConfigError, match="screen_growth acts in the screen allocator's same-step follow-up"):
        build_config({"planner": {"screen_followup": "next_step", "screen_growth": "eager"}})
    with pytest.raises(ConfigError, match="filter_zero_variance=false has no effect with the filter selector"):
        build_config({"planner": {"strategy": "dapo", "filter_zero_variance": False}})
    with pytest.raises(ConfigError, match=r"planner.screen_size \(8\) must be below rollout.num_generations \(8\)"):
        build_config({"planner": {"screen_size": 8}})
    assert build_config({"planner": {"screen_size": 4}}).planner.screen_size == 4


def test_settings_another_setting_makes_idle_are_named() -> None:
    got = unused_settings(load_config(None, ["planner.strategy=dapo", "planner.seed=5", "algo.beta=0.01",
                                             "train.skip_zero_advantage=false", "data.eval_size=0",
                                             "eval.max_completion_length=64",
                                             "algo.offpolicy_correction=mask_resumed"]))
    assert {line.split("=")[0] for line in got} == {
        "algo.offpolicy_correction", "train.skip_zero_advantage", "planner.seed", "eval.max_completion_length"}, got
    assert unused_settings(load_config(None, ["planner.strategy=mopps", "planner.seed=5",
                                              "algo.offpolicy_correction=mask_resumed", "rollout.partial_rollouts=true",
                                              "rollout.engine=continuous"])) == []
    got = unused_settings(load_config(None, ["planner.budget_rollouts=32", "planner.revisit_cooldown=2",
                                             "rollout.prompts_per_step=16"]))
    assert [line.split("=")[0] for line in got] == ["rollout.prompts_per_step"]


def test_every_planner_option_is_general_or_names_the_parts_that_read_it() -> None:
    # a new option of one part must go into PART_OPTIONS, or it is accepted and ignored elsewhere
    from rollwise.config import PlannerConfig
    from rollwise.planner.strategies import PART_OPTIONS

    general = {"strategy", "estimator", "selector", "allocator", "repair", "budget_rollouts", "budget_tokens",
               "success_threshold", "target_solve_rate", "filter_zero_variance", "length_ema", "revisit_cooldown", "prior_counts",
               "seed"}
    assert set(PlannerConfig.model_fields) == general | set(PART_OPTIONS)


def test_async_staleness_without_a_correction_is_named():
    got = unused_settings(load_config(None, ["distributed.async_training=true"]))
    assert len(got) == 1 and "algo.offpolicy_correction=recompute trains every token as on-policy" in got[0]
    assert unused_settings(load_config(None, ["distributed.async_training=true",
                                              "algo.offpolicy_correction=decoupled"])) == []
    assert unused_settings(load_config(None, ["distributed.async_training=true", "distributed.max_staleness=0"])) == []
    assert unused_settings(load_config(None, ["distributed.backend=ray"])) == []  # synchronous with workers: no staleness


def test_settings_of_features_left_off_are_named():
    assert unused_settings(load_config()) == []
    for path in Path(__file__).parents[1].glob("configs/*.yaml"):  # shipped configs set nothing they do not use
        assert unused_settings(load_config(str(path))) == [], path
    got = unused_settings(load_config(None, ["rollout.partial_stop_fraction=0.5", "algo.kl_estimator=k1",
                                             "distributed.max_staleness=3", "algo.tis_cap=4"]))
    assert got == ["rollout.partial_stop_fraction=0.5 has no effect: it is read only with rollout.partial_rollouts=true",
                   "algo.tis_cap=4.0 has no effect: it is read only with algo.offpolicy_correction=tis",
                   "algo.kl_estimator=k1 has no effect: it is read only with algo.beta > 0",
                   "distributed.max_staleness=3 has no effect: it is read only with distributed.async_training=true"]
    # options of one engine, loss, advantage, backend or model kind, set where another is used
    got = unused_settings(load_config(None, [
        "model.name_or_path=/some/folder", "model.cache_dir=/tmp/c", "model.lora.r=4", "data.use_chat_template=false",
        "data.system_prompt=hi", "planner.budget_rollouts=32", "rollout.prompts_per_step=4", "rollout.engine=vllm",
        "rollout.batch_size=16", "algo.advantage=rloo", "algo.scale_rewards=none", "algo.policy_loss=cispo",
        "algo.epsilon_high=5", "algo.epsilon=0.3", "algo.dual_clip=3", "distributed.async_training=true",
        "distributed.worker_threads=2", "eval.at_start=false", "eval.at_end=false", "eval.save_best=true"]))
    assert [line.split("=")[0] for line in got] == [
        "model.cache_dir", "model.lora.r", "data.system_prompt", "rollout.prompts_per_step", "rollout.batch_size",
        "algo.scale_rewards", "algo.dual_clip", "algo.epsilon", "algo.epsilon_high", "algo.policy_loss",
        "distributed.worker_threads", "eval.save_best", "distributed.max_staleness"]  # async with the default correction: stale tokens trained as on-policy
    assert got[1] == "model.lora.r=4 has no effect: it is read only with model.lora.enabled=true"
    assert unused_settings(load_config(None, ["model.lora.enabled=true", "model.lora.r=4", "model.cache_dir=/tmp/c",
                                              "data.system_prompt=hi", "rollout.prompts_per_step=4",
                                              "rollout.batch_size=16", "algo.scale_rewards=none", "algo.dual_clip=3",
                                              "algo.num_iterations=2", "eval.save_best=true", "distributed.backend=ray",
                                              "distributed.worker_threads=2"])) == []


def test_evaluation_options_without_an_evaluation_are_named():
    got = unused_settings(load_config(None, ["data.eval_size=0", "eval.every_n_steps=5", "eval.pass_k=4",
                                             "eval.early_stopping_patience=3", "eval.batch_size=8"]))
    assert [line.split("=")[0] for line in got] == ["eval.every_n_steps", "eval.early_stopping_patience",
                                                   "eval.pass_k", "eval.batch_size"]
    assert got[-1].startswith("eval.batch_size=8 has no effect: it is read only with `rollwise eval`")
    assert unused_settings(load_config(None, ["eval.every_n_steps=5", "eval.pass_k=4",
                                              "eval.early_stopping_patience=3"])) == []


def test_settings_that_cannot_act_under_the_others_are_named():
    """Found by an audit: accepted without a word, yet without effect."""
    def keys(*overrides):
        return [line.split("=")[0] for line in unused_settings(load_config(None, list(overrides)))]

    # one update per batch: every ratio is 1, no clip bound acts (DAPO's clip-higher needs num_iterations > 1)
    assert keys("algo.epsilon_high=0.28", "algo.epsilon=0.1", "algo.dual_clip=3") == [
        "algo.dual_clip", "algo.epsilon", "algo.epsilon_high"]
    assert keys("algo.epsilon_high=0.28", "algo.epsilon=0.1", "algo.dual_clip=3", "algo.num_iterations=2") == []
    # ... nor do GSPO's and CISPO's ratios: at one update their gradients are ppo_clip's
    assert keys("algo.policy_loss=cispo") == ["algo.policy_loss"]
    assert keys("algo.policy_loss=cispo", "algo.num_iterations=2") == []
    # GSPO's objective averages sequences (loss_type grpo); the default token mean weights them by length
    assert keys("algo.policy_loss=gspo", "algo.num_iterations=2") == ["algo.policy_loss"]
    assert "algo.loss_type=grpo" in unused_settings(load_config(None, ["algo.policy_loss=gspo", "algo.num_iterations=2"]))[0]
    assert keys("algo.policy_loss=gspo", "algo.num_iterations=2", "algo.loss_type=grpo") == []
    # CISPO's only bound is its cap 1 + epsilon_high: below epsilon is no contradiction
    assert load_config(None, ["algo.policy_loss=cispo", "algo.epsilon_high=0.1"]).algo.epsilon_high == 0.1
    # an evaluation every 50 steps of a 40-step run never comes; a patience of 5 cannot be reached with 4
    # evaluations before the last step (at the start, then steps 10, 20, 30: the first only sets the best)
    assert keys("eval.every_n_steps=40") == ["eval.every_n_steps"]
    assert keys("eval.every_n_steps=10", "eval.early_stopping_patience=4") == ["eval.early_stopping_patience"]
    assert keys("eval.every_n_steps=10", "eval.early_stopping_patience=3") == []
    assert keys("eval.every_n_steps=10", "eval.early_stopping_patience=3", "eval.at_start=false") == [
        "eval.early_stopping_patience"]
    # at a staleness of 0 no weights arrive while a batch generates; a stop fraction of 1 carries nothing
    at0 = ("distributed.async_training=true", "distributed.max_staleness=0")
    assert keys(*at0, "distributed.weight_sync_tokens=64", "rollout.partial_keep_kv=true",
                "algo.offpolicy_correction=mask_resumed") == [
        "rollout.partial_keep_kv", "distributed.weight_sync_tokens", "algo.offpolicy_correction"]
    assert keys("distributed.async_training=true", "distributed.weight_sync_tokens=64", "rollout.partial_keep_kv=true",
                "algo.offpolicy_correction=mask_resumed") == []
    whole = ("rollout.partial_rollouts=true", "rollout.partial_stop_fraction=1")
    assert keys(*whole, "rollout.retention_limit=1", "rollout.partial_keep_kv=true") == [
        "rollout.retention_limit", "rollout.partial_keep_kv"]


def test_vllm_truncated_sampling_under_an_importance_weighted_correction_is_named():
    # vLLM's behaviour log-probs are those of the top-k/top-p distribution, the trainer's of the full one
    def biased(*overrides):
        return [g for g in unused_settings(load_config(None, list(overrides))) if "biases" in g]

    assert len(biased("rollout.engine=vllm", "rollout.top_p=0.9", "algo.offpolicy_correction=tis")) == 1
    assert len(biased("rollout.engine=vllm", "rollout.top_k=20", "algo.offpolicy_correction=icepop")) == 1
    assert biased("rollout.top_p=0.9", "algo.offpolicy_correction=tis") == []  # the continuous engine: full
    assert biased("rollout.engine=vllm", "algo.offpolicy_correction=tis") == []  # nothing truncated
    assert biased("rollout.engine=vllm", "rollout.top_p=0.9") == []  # recompute: the log-probs only feed a metric


def test_a_success_threshold_no_reward_can_reach_is_named():
    low = "reward.functions=[{name: reasoning_gym, weight: 0.4}]"
    got = unused_settings(load_config(None, [low]))  # the default threshold 0.5 above a best reward of 0.4
    assert len(got) == 1 and got[0].startswith("planner.success_threshold=0.5 is above the highest reward")
    assert unused_settings(load_config(None, [low, "planner.success_threshold=0.4"])) == []  # reachable: fine
    two = "reward.functions=[{name: exact_match, weight: 0.6}, {name: format, weight: 0.3}]"
    got = unused_settings(load_config(None, [two, "planner.success_threshold=1.0"]))
    assert got and "(0.9: each scores at most 1)" in got[0] and got[0].endswith("set it to at most 0.9")
    # a user's function may score above 1: nothing is claimed about it
    assert unused_settings(load_config(None, ["reward.functions=[{name: 'mymod:score', weight: 0.5}]",
                                              "planner.success_threshold=1.0"])) == []


def test_settings_read_only_in_narrower_setups_are_named():
    # a KV cache kept across weight updates: only the continuous engine holds one, and only partial
    # rollouts or asynchronous training change weights while sequences are in flight
    keep = "rollout.partial_keep_kv=true"
    assert unused_settings(load_config(None, [keep, "distributed.backend=ray"]))[0].startswith(
        "rollout.partial_keep_kv=True has no effect: it is read only with rollout.engine=continuous")
    assert unused_settings(load_config(None, [keep, "distributed.async_training=true", "rollout.engine=vllm"])) != []
    assert unused_settings(load_config(None, [keep, "distributed.async_training=true",
                                              "algo.offpolicy_correction=decoupled"])) == []
    assert unused_settings(load_config(None, [keep, "rollout.partial_rollouts=true"])) == []
    # a decay that would start after the run's last update
    got = unused_settings(load_config(None, ["train.lr_scheduler=cosine", "train.max_steps=4", "train.warmup_steps=4"]))
    assert got == ["train.lr_scheduler=cosine has no effect: it is read only with train.warmup_steps below "
                   "train.max_steps x algo.num_iterations (the decay follows the warm-up)"]
    assert unused_settings(load_config(None, ["train.lr_scheduler=cosine", "train.max_steps=4", "train.warmup_steps=4",
                                              "algo.num_iterations=2"])) == []
    assert unused_settings(load_config(None, ["reward.overlong_penalty=0.5"])) == [
        "reward.overlong_penalty=0.5 has no effect: it is read only with reward.overlong_buffer > 0"]
    with pytest.raises(ConfigError, match="reward.overlong_buffer \\(48\\) must be below"):
        load_config(None, ["reward.overlong_buffer=48"])
    # a mixture weight with nothing to mix
    got = unused_settings(load_config(None, ["data.tasks=[{name: gcd, weight: 3}]"]))
    assert got == ["data.tasks[0].weight=3.0 has no effect: a weight is a task's share of a mixture, and this one "
                   "has a single task"]
    assert unused_settings(load_config(None, ["data.tasks=[{name: gcd, weight: 3}, {name: lcm}]"])) == []


def test_a_task_rejects_the_fields_of_the_other_kind(tmp_path):
    with pytest.raises(ConfigError, match="params apply to reasoning-gym generators only"):
        load_config(None, [f"data.tasks=[{{name: mine, path: {tmp_path}/a.jsonl, params: {{max_digits: 2}}}}]"])
    with pytest.raises(ConfigError, match="prompt_column applies to file tasks only"):
        load_config(None, ["data.tasks=[{name: gcd, prompt_column: q}]"])
    load_config(None, [f"data.tasks=[{{name: mine, path: {tmp_path}/a.jsonl, prompt_column: q}}]"])


def test_settings_of_features_left_off_stay_quiet_where_on():
    # the same settings where their feature is on: nothing to say
    assert unused_settings(load_config(None, ["algo.beta=0.01", "algo.kl_estimator=k1", "algo.offpolicy_correction=tis",
                                              "algo.tis_cap=4"])) == []


def test_planner_seed_is_read_by_planners_with_random_choices_only():
    assert unused_settings(load_config(None, ["planner.seed=3"])) == []  # adaptive draws
    got = unused_settings(load_config(None, ["planner.seed=3", "planner.strategy=uniform"]))
    assert len(got) == 1 and got[0].startswith("planner.seed=3 has no effect")
    assert unused_settings(load_config(None, ["planner.seed=3", "planner.strategy=uniform",
                                              "planner.selector=posterior"])) == []


def test_config_changes_name_each_changed_leaf_with_old_and_new():
    from rollwise.config import config_changes

    old = {"train": {"max_steps": 2, "lr": 1e-6}, "reward": {"functions": [{"name": "a"}]}, "run": {"seed": 0}}
    new = {"train": {"max_steps": 4, "lr": 1e-6}, "reward": {"functions": [{"name": "b"}]}, "run": {"seed": 0},
           "planner": {"strategy": "dapo"}}
    assert config_changes(old, new) == ({"train.max_steps": [2, 4],
                                         "reward.functions": [[{"name": "a"}], [{"name": "b"}]]},
                                        {"planner.strategy": "dapo"})  # new since `old` was written
    assert config_changes(new, new) == ({}, {})
    assert config_changes(new, old) == ({"train.max_steps": [4, 2], "reward.functions": [[{"name": "b"}], [{"name": "a"}]],
                                         "planner.strategy": ["dapo", None]}, {})


def test_trl_names_point_to_their_rollwise_keys():
    for override, key in (("learning_rate=1e-5", "train.learning_rate"), ("run.save_total_limit=2", "run.keep_checkpoints"),
                          ("eval_steps=5", "eval.every_n_steps"), ("algo.importance_sampling_level=sequence",
                                                                    "algo.policy_loss=gspo")):
        with pytest.raises(ConfigError, match=rf"TRL's \w+ is {re.escape(key)}"):
            load_config(None, [override])
