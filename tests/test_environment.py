"""environment.json: what a run was computed on, and which fields differ between runs."""

import json

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
