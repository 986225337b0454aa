#!/usr/bin/env bash
# Builds and smoke-tests torch_ort against another torch, leaving .venv, build/ and the in-tree
# .so files alone:
#
#   scripts/check_torch.sh [TORCH_VERSION] [PYTHON]        # defaults: 2.11.0 python3.12
#
# Everything lives under build-torch-<version>/ (git-ignored):
#   venv/  that torch plus what the build and the tests need (PACKAGES: the other pins; the
#          default is the GPU test machine's set). --system-site-packages: on a machine without a
#          package registry, packages the interpreter already has satisfy the pins.
#   tree/  a copy of the working tree (git-ignored files left out), built in place
# Then `import torch_ort` and a smoke subset of pytest with FALLBACK_DISABLE (TESTS overrides it),
# run to the end so that one failure does not hide the others. Known on torch 2.11: a
# transformers DynamicCache inside the exported forward (a no_grad call of GPT-2 or T5) fails in
# torch's run_decompositions (IndexError in _get_updated_module_call_graph; fixed in later torch).
# Env: PACKAGES, TESTS, MAX_JOBS (2), TORCH_CUDA_ARCH_LIST (9.0).
set -euo pipefail

VERSION="${1:-2.11.0}"
PYTHON="${2:-python3.12}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/build-torch-$VERSION"
VENV="$DIR/venv"
TREE="$DIR/tree"
PACKAGES="${PACKAGES:-onnx==1.23.1 onnxscript==0.7.2 onnx-ir==1.0.0 transformers==5.17.*}"
TESTS="${TESTS:-tests/python/test_parity.py tests/python/test_models.py tests/python/test_python_op.py
  tests/python/test_checkpoint.py tests/python/test_module_api.py tests/python/test_nn_lm.py
  tests/python/test_autocast.py tests/python/test_hf_trainer.py tests/python/test_cnn.py
  tests/python/test_model_io.py}"
log() { echo "[check_torch] $*"; }
command -v rsync >/dev/null || { echo "[check_torch] error: needs rsync (apt-get install rsync)" >&2; exit 1; }

# --- 1. the environment (once; pip's cache keeps the torch wheel).
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $PYTHON, torch==$VERSION"
  mkdir -p "$DIR"
  "$PYTHON" -m venv --system-site-packages "$VENV"
  read -ra pins <<< "$PACKAGES"  # one pip argument per package, no globbing of '5.17.*'
  "$VENV/bin/python" -m pip install -q "torch==$VERSION" "${pins[@]}" \
    numpy pytest ninja setuptools accelerate scikit-learn onnxruntime psutil
fi
export PATH="$VENV/bin:$PATH"  # ninja for cpp_extension

# --- 2. the copy: tracked and untracked files as in the working tree; what .gitignore names
# (.venv, build/, *.so, this folder) is neither copied nor deleted on the other side.
log "syncing the working tree to $TREE"
mkdir -p "$TREE/build/third_party"
# By content, not modification time, and a changed file gets the time of the copy: a source
# edited before the copy's last build but synced after it must still look newer than its object.
rsync -rlpD --checksum --delete --exclude=/.git --filter=':- .gitignore' "$ROOT/" "$TREE/"
# protobuf-lite and the ONNX arity table do not depend on torch: reuse the checkout's.
if [ -d "$ROOT/build/generated" ] && [ -d "$ROOT/build/third_party/protobuf-lite" ]; then
  rsync -a "$ROOT/build/generated" "$TREE/build/"
  rsync -a "$ROOT/build/third_party/protobuf-lite" "$TREE/build/third_party/"
else
  "$VENV/bin/python" "$TREE/scripts/build_protobuf.py"
fi

# --- 3. build, import, smoke tests.
cd "$TREE"
log "building torch_ort._C against torch $VERSION (log: $DIR/build.log)"
MAX_JOBS="${MAX_JOBS:-2}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" CCACHE_BASEDIR="$TREE" \
  python setup.py build_ext --inplace > "$DIR/build.log" 2>&1 || { tail -40 "$DIR/build.log"; exit 1; }
python -c "import sys, torch, torch_ort; print('[check_torch] import torch_ort: ok, torch', \
torch.__version__, 'python', sys.version.split()[0])"
# shellcheck disable=SC2086  # TESTS is a list of paths
ORTMODULE_FALLBACK_POLICY=FALLBACK_DISABLE python -m pytest -q -p no:cacheprovider $TESTS
