#!/usr/bin/env bash
# Fuzzes model loading (tests/fuzz/fuzz_model_loading.cc: import -> verify -> shapes -> passes ->
# gradients -> plan, under ASan+UBSan) for a fixed time, or until a number of executions.
#   scripts/fuzz.sh            # 60 s
#   scripts/fuzz.sh 1800       # 30 minutes
#   scripts/fuzz.sh 900 15000  # 15000 executions, at most 900 s (the same work on a busy machine)
# The corpus grows in build/fuzz-corpus (seeded from tests/fuzz/corpus, which stays untouched).
# A crash, sanitizer report, timeout (-timeout) or out-of-memory (-rss_limit_mb) exits non-zero
# and leaves its input in build/fuzz-crashes; replay it with
#   build/sanitize/fuzz_model_loading build/fuzz-crashes/crash-<sha1>
# and, once fixed, copy it to tests/fuzz/regressions/ (ctest's fuzz_regressions replays them).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${1:-60}"
RUNS="${2:--1}"  # -1: no bound on executions
BUILD=build/sanitize
FUZZER="$BUILD/fuzz_model_loading"
CORPUS=build/fuzz-corpus
CRASHES=build/fuzz-crashes
export CCACHE_BASEDIR="$PWD"
# -g puts the build directory into the debug info, so ccache hashes it unless told not to: a fresh
# clone elsewhere then misses every object. Debug info keeps the first build's paths (harmless).
export CCACHE_NOHASHDIR=1

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DTORCH_ORT_SANITIZE=ON -DTORCH_ORT_BUILD_FUZZER=ON > /dev/null
fi
cmake --build "$BUILD" -j "${MAX_JOBS:-2}" --target fuzz_model_loading

mkdir -p "$CORPUS" "$CRASHES"
cp -n tests/fuzz/corpus/* "$CORPUS"/
# The largest seed bounds generated inputs (libFuzzer's default would be 4 KiB: too small for a
# transformer graph), with room for the structured mutator to grow it.
max_len=$(( $(find tests/fuzz/corpus -type f -printf '%s\n' | sort -n | tail -1) * 2 ))

# detect_container_overflow=0: protobuf-lite is uninstrumented (scripts/sanitize.sh says why).
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:detect_container_overflow=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
before=$(find "$CORPUS" -type f | wc -l)
log="$CRASHES/last-run.log"
set +e
"$FUZZER" "$CORPUS" -max_total_time="$SECONDS_TO_RUN" -runs="$RUNS" -rss_limit_mb=2048 -timeout=10 \
  -max_len="$max_len" -artifact_prefix="$CRASHES/" -print_final_stats=1 2>&1 | tee "$log" | grep -E "^#[0-9]+[[:space:]]+(INITED|DONE)|ERROR|SUMMARY|what\(\)|stat::|Test unit written"
rc=${PIPESTATUS[0]}
set -e
after=$(find "$CORPUS" -type f | wc -l)
execs=$(awk '/stat::number_of_executed_units:/ {n += $2} END {print n + 0}' "$log")
echo "[fuzz] ${SECONDS} s elapsed (bounds: ${SECONDS_TO_RUN} s, ${RUNS} runs): ${execs} executions, corpus ${before} -> ${after} files, exit ${rc}"
if [ "$rc" -ne 0 ]; then
  echo "[fuzz] FAILED: the input is in $CRASHES (log: $log)" >&2
  exit "$rc"
fi
