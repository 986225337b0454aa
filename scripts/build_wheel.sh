#!/usr/bin/env bash
# Builds torch_ort's sdist and, from it, a wheel for the torch of PYTHON's environment (default
# .venv), into dist/:
#   torch_ort-<version>.tar.gz                                    every input of the build
#   torch_ort-<version>+torch<major.minor>-<py>-<py>-linux_<arch>.whl
# The wheel is built the way `pip install` builds for a user: by that environment's pip, in an
# isolated build environment, against that environment's torch (scripts/build_backend.py). It holds
# torch_ort._C (and torch_ort._C_cuda where nvcc is) with protobuf-lite and abseil linked in
# statically and hidden: installing it needs only the torch release it names, no compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export MAX_JOBS=${MAX_JOBS:-2}
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' torch_ort/__init__.py)
rm -rf "dist/torch_ort-$version.tar.gz" dist/torch_ort-"$version"+*.whl
mkdir -p dist
# The sdist needs setuptools only, no torch: any Python with setuptools>=77 (.venv's by default).
"${SDIST_PYTHON:-.venv/bin/python}" -c 'import sys; sys.path.insert(0, "scripts"); import build_backend
print("[build_wheel] sdist:", build_backend.build_sdist("dist"))' | grep '^\[build_wheel\]'
"$PY" -m pip wheel -q --no-deps --wheel-dir dist "dist/torch_ort-$version.tar.gz"
ls dist/torch_ort-"$version"+*.whl
