#!/usr/bin/env bash
# Runs every test: the wheel, built, installed into a fresh environment and trained through
# (scripts/check_wheel.sh); the C++ core's include graph (scripts/include_graph.py), the torch-free
# core's GoogleTest suite under ASan+UBSan with a bounded fuzz pass (scripts/sanitize.sh,
# scripts/fuzz.sh; FUZZ_RUNS changes it); then pytest. Installs what it needs first
# (scripts/bootstrap.sh).
# Each part prints when it started, so a log shows where the time goes.
#
# The parts run one after the other, each keeping both cores busy, but for the wheel's check:
# mostly one process at a time (linking, pip, one training run), it runs beside the C++ core's
# checks, and its log is printed when they are done. (Run beside pytest at nice 19, the sanitizer
# build got almost no CPU and still slowed pytest by minutes, through memory and caches.) The
# GoogleTest suite is built once, under the sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
part() { echo "[test] $* (at $(( $(date +%s) - start )) s)"; }

part "bootstrap"
scripts/bootstrap.sh

part "the wheel, installed outside the checkout (beside the C++ core's checks; log: build/check_wheel.log)"
mkdir -p build
setsid scripts/check_wheel.sh > build/check_wheel.log 2>&1 &
wheel=$!  # its own process group: stopped whole if a part below fails
trap 'kill -- -"$wheel" 2>/dev/null || true' EXIT

part "the C++ core's include graph"
.venv/bin/python scripts/include_graph.py

part "C++ core: GoogleTest under ASan+UBSan (build/sanitize)"
scripts/sanitize.sh
part "C++ core: a bounded fuzz pass"
# Bounded by executions (as many as 60 s give on an idle core), so a slower machine fuzzes as
# much; timeout bounds everything else (build, corpus loading).
timeout 900 scripts/fuzz.sh 900 "${FUZZ_RUNS:-15000}"

part "the wheel's check: its log"
wheel_rc=0
wait "$wheel" || wheel_rc=$?
cat build/check_wheel.log
if [ "$wheel_rc" -ne 0 ]; then
  echo "[test] the wheel's check failed (exit $wheel_rc)" >&2
  exit "$wheel_rc"
fi

part "Python (pytest)"
# --durations: the slowest tests, so that a CI log shows where the time goes. Two workers, one
# file each at a time (a file's module fixtures are built once): most of a test's time is the
# exporter's Python, one core each.
# OMP_WAIT_POLICY=PASSIVE: a worker's idle OpenMP threads sleep instead of spinning on the core
# the other worker needs (measured on 2 cores: 7 % less time; three workers took 40 % more).
OMP_WAIT_POLICY=PASSIVE .venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist loadfile --durations=20 \
  tests/python "$@"
part "done"
