#!/usr/bin/env bash
# Fuzzes model loading (tests/fuzz/fuzz_model_loading.cc: import -> verify -> shapes -> passes ->
# gradients -> plan, under ASan+UBSan) for a fixed time, or until a number of executions.
#   scripts/fuzz.sh            # 60 s
#   scripts/fuzz.sh 1800       # 30 minutes
#   scripts/fuzz.sh 900 15000  # 15000 executions, at most 900 s (the same work on a busy machine)
# One fuzzer process per core (FUZZ_JOBS=1: one), each running its share of the executions.
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
# One fuzzer process per core (FUZZ_JOBS), sharing the corpus, the executions split between them:
# libFuzzer runs on one core, and this pass is most of a minute of the test run.
jobs=${FUZZ_JOBS:-$(nproc)}
per_job=$(( RUNS < 0 ? -1 : (RUNS + jobs - 1) / jobs ))
rm -f "$CRASHES"/last-run*.log
pids=()
for ((j = 1; j <= jobs; j++)); do
  "$FUZZER" "$CORPUS" -max_total_time="$SECONDS_TO_RUN" -runs="$per_job" -rss_limit_mb=2048 -timeout=10 \
    -max_len="$max_len" -artifact_prefix="$CRASHES/" -print_final_stats=1 > "$CRASHES/last-run.$j.log" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do
  wait "$pid" || rc=$?
done
grep -hE "^#[0-9]+[[:space:]]+(INITED|DONE)|ERROR|SUMMARY|what\(\)|stat::|Test unit written" "$CRASHES"/last-run.*.log
after=$(find "$CORPUS" -type f | wc -l)
execs=$(awk '/stat::number_of_executed_units:/ {n += $2} END {print n + 0}' "$CRASHES"/last-run.*.log)
echo "[fuzz] ${SECONDS} s elapsed (bounds: ${SECONDS_TO_RUN} s, ${RUNS} runs, ${jobs} processes): ${execs} executions, corpus ${before} -> ${after} files, exit ${rc}"
if [ "$rc" -ne 0 ]; then
  echo "[fuzz] FAILED: the input is in $CRASHES (logs: $CRASHES/last-run.*.log)" >&2
  exit "$rc"
fi
