#!/usr/bin/env bash
# Builds the torch-free core and its GoogleTest suite with AddressSanitizer + UndefinedBehavior
# Sanitizer (clang, build/sanitize; the fuzzer is built from the same objects) and runs the suite,
# the fuzzer's saved crash inputs included (FuzzRegressions.*, tests/fuzz/regressions).
# Any sanitizer report fails the run (-fno-sanitize-recover=all, halt_on_error).
#   scripts/sanitize.sh                                  # everything
#   scripts/sanitize.sh --gtest_filter='Limits*'         # extra arguments go to the test binary
# Needs clang and libclang-rt-dev (scripts/bootstrap.sh installs them) and build_protobuf.py's
# outputs. ccache hits across clones when CCACHE_BASEDIR is the checkout (set here).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD"
# -g puts the build directory into the debug info, so ccache hashes it unless told not to: a fresh
# clone elsewhere then misses every object. Debug info keeps the first build's paths (harmless).
export CCACHE_NOHASHDIR=1
BUILD=build/sanitize

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DTORCH_ORT_SANITIZE=ON -DTORCH_ORT_BUILD_FUZZER=ON > /dev/null
fi
start=$(date +%s)
cmake --build "$BUILD" -j "${MAX_JOBS:-2}"
echo "[sanitize] build: $(( $(date +%s) - start )) s"

# detect_leaks: the tests leak nothing on purpose; a leak is a finding like any other report.
# detect_container_overflow=0: protobuf's headers annotate RepeatedField's spare capacity for ASan
# when compiled under it, but the protobuf library (gcc, uninstrumented) that grows the fields
# does not, so instrumented reads of valid elements are reported. Heap overflows past a
# container's allocation are still caught.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:strict_string_checks=1:detect_container_overflow=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
# The binary, not ctest: one process per test pays ASan's start-up 700 times (108 s against 12 s).
# GoogleTest's shards, one process per core (the tests run on one core each).
shards=${TEST_JOBS:-$(nproc)}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
for ((i = 0; i < shards; i++)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$BUILD/torch_ort_core_tests" --gtest_brief=1 "$@" > "$logs/$i" 2>&1 &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || rc=$?
  echo "[sanitize] shard $((i + 1)) of $shards:"
  cat "$logs/$i"
done
exit $rc
