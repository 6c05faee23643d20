"""bench/ scripts without argparse: `--help` prints their usage and runs nothing; bad input is a clear error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench"

# scripts that read sys.argv by hand (or not at all): before the fix `--help` ran them (kl_reference loaded the
# model for ~40 s, vllm_gpu built the data and made bench/out/vllm_gpu), took it for a folder or a dtype, or crashed
HAND_ARGV = ["cut_successes", "kl_reference", "learning_shape", "length_gap", "partial_budget", "spec_bank_size",
             "spec_same_weights", "token_budget_guess", "vllm_gpu"]


def _run(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    try:
        return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args} still ran after {timeout} s")


@pytest.mark.parametrize("name", HAND_ARGV)
def test_help_prints_usage_and_runs_nothing(name, tmp_path):
    script = BENCH / f"{name}.py"
    first = script.read_text().split('"""')[1].strip().splitlines()[0]
    got = _run([str(script), "--help"], cwd=tmp_path, timeout=30)
    assert got.returncode == 0, got.stderr[-2000:]
    assert first in got.stdout
    assert not any(tmp_path.iterdir())  # nothing written (vllm_gpu made bench/out/vllm_gpu under the cwd)


def test_cut_successes_refuses_a_folder_that_does_not_exist(tmp_path):
    got = _run([str(BENCH / "cut_successes.py"), str(tmp_path / "no_such_folder")], cwd=tmp_path)
    assert got.returncode != 0  # it printed two empty tables and exited 0
    assert "no_such_folder" in got.stderr


def test_spec_same_weights_names_the_dtypes_it_takes(tmp_path):
    got = _run([str(BENCH / "spec_same_weights.py"), "fp32"], cwd=tmp_path)
    assert got.returncode == 2, got.stderr[-2000:]  # AttributeError: module 'torch' has no attribute 'fp32'
    assert "float32" in got.stderr and "Traceback" not in got.stderr


def test_learning_shape_says_which_bench_writes_its_input(tmp_path):
    got = _run([str(BENCH / "learning_shape.py")], cwd=tmp_path)
    assert got.returncode != 0
    assert "bench/zero_rate_prompts.py" in got.stderr and "Traceback" not in got.stderr
