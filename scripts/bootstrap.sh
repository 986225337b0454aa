#!/usr/bin/env bash
# Installs what torch_ort's development needs on a fresh Debian machine, idempotently: Debian
# packages (the compilers, GoogleTest, clang for the sanitizers), the virtual environment with
# pinned Python packages, protobuf-lite, and the torch_ort._C extension built in place.
# (A user install needs none of this: `pip install .`, see docs/install.md.)
# Re-running it only rebuilds what changed (ccache keeps C++ rebuilds cheap).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# clang + libclang-rt-dev: the ASan/UBSan build of the core and the libFuzzer target (scripts/sanitize.sh, fuzz.sh)
# iproute2: the GPU check's dry run brings up the loopback device of its own network namespace
debs=(build-essential cmake ninja-build ccache libgtest-dev python3-dev python3-venv xz-utils
      clang libclang-rt-dev iproute2)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[bootstrap] apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

PY=${PYTHON:-python3}
UV_VERSION=0.13.9  # the installer of the pinned packages below
if [ ! -x .venv/bin/python ]; then
  echo "[bootstrap] creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
stamp=.venv/.requirements.sha
want=$( (cat requirements.txt requirements-no-isolation.txt; echo "$UV_VERSION") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # torch's CUDA wheel and its libraries fill about 6.5 GiB once installed, and the installer needs room to
  # unpack them besides: refuse early, naming the shortfall, rather than fail midway in pip.
  free_kib=$(df -Pk . | awk 'NR==2 {print $4}')
  if [ "$free_kib" -lt $((9 * 1024 * 1024)) ]; then
    echo "[bootstrap] error: $((free_kib / 1024)) MiB free on $(df -P . | awk 'NR==2 {print $6}');" \
         "the virtual environment needs about 9 GiB while installing" >&2
    exit 1
  fi
  # uv installs the same pins as pip would, but downloads and unpacks in parallel: on 2 cores the
  # whole set took 51 s against pip's 170 s. --compile-bytecode as pip does: where the
  # environment sets PYTHONDONTWRITEBYTECODE, nothing would ever cache torch's bytecode.
  echo "[bootstrap] uv pip install -r requirements.txt (torch is a large download the first time)"
  .venv/bin/pip install -q "uv==$UV_VERSION"
  uv=(.venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python)
  "${uv[@]}" -r requirements.txt
  DS_BUILD_OPS=0 "${uv[@]}" --no-build-isolation --no-deps -r requirements-no-isolation.txt
  echo "$want" > "$stamp"
fi

# The private protobuf-lite and our ONNX message classes (from PyPI sources: no system protobuf);
# the extension's build would make them too, the CMake test build needs them as well.
.venv/bin/python scripts/build_protobuf.py

echo "[bootstrap] building torch_ort._C"
# The extension is built as users get it: core and runtime sources grouped into unity
# translation units (setup.py). TORCH_ORT_UNITY=0 compiles one source per object, for quicker
# rebuilds while editing; the CMake build of the core's tests always does. MAX_JOBS: the cores.
export CCACHE_BASEDIR="$PWD"  # cache hits across checkouts at other paths (CI clones afresh)
.venv/bin/python setup.py -q build_ext --inplace
# The checkout on the venv's path (a .pth file): `import torch_ort` works from any directory, e.g.
# for the examples, and always sees this checkout's sources and the extension built above in
# place. (`pip install -e .` would compile the extension once more in a temporary directory.)
# The check runs from / so that the current directory does not make the import succeed.
root=$PWD  # (inside the subshell below, $PWD is / by the time the command line is expanded)
site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$root" > "$site/torch_ort_checkout.pth"
(cd / && "$root/.venv/bin/python" -c "import torch_ort, sys; sys.exit(0 if torch_ort.__file__.startswith('$root/') else 1)") ||
  { echo "[bootstrap] error: import torch_ort does not find $root" >&2; exit 1; }
