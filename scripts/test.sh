#!/usr/bin/env bash
# Runs every test: the torch-free core's GoogleTest suite (release, then under ASan+UBSan with a
# 60 s fuzz pass: scripts/sanitize.sh, scripts/fuzz.sh; FUZZ_SECONDS changes it), pytest, then
# the wheel: built, installed into a fresh environment and trained through (scripts/check_wheel.sh).
# Installs what it needs first (scripts/bootstrap.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh

echo "[test] C++ core (GoogleTest)"
export CCACHE_BASEDIR="$PWD"
cmake -S . -B build/cmake -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build/cmake -j "${MAX_JOBS:-2}"
(cd build/cmake && ctest --output-on-failure -j 2)

echo "[test] C++ core under ASan+UBSan (clang, build/sanitize), then a bounded fuzz pass"
scripts/sanitize.sh
# -max_total_time bounds the fuzzing; timeout bounds everything else (build, corpus loading).
timeout 600 scripts/fuzz.sh "${FUZZ_SECONDS:-60}"

echo "[test] Python (pytest)"
# --durations: the slowest tests, so that a CI log shows where the time goes. Two workers, one
# file each at a time (a file's module fixtures are built once): most of a test's time is the
# exporter's Python, one core each.
.venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist loadfile --durations=20 tests/python "$@"

echo "[test] the wheel, installed outside the checkout"
scripts/check_wheel.sh
