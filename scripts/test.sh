#!/usr/bin/env bash
# Runs every test: the C++ core's include graph (scripts/include_graph.py), the torch-free core's
# GoogleTest suite under ASan+UBSan with a bounded fuzz pass (scripts/sanitize.sh, scripts/fuzz.sh;
# FUZZ_RUNS changes it), pytest, then the wheel: built, installed into a fresh environment and
# trained through (scripts/check_wheel.sh). Installs what it needs first (scripts/bootstrap.sh).
#
# Where the time goes, on 2 cores: pytest is most of it and keeps the cores busy but not full (its
# workers wait on subprocesses, on imports, on each other at the end). The sanitizer build, its
# tests and the fuzz pass are a fixed amount of work that needs no core of its own, so they run
# beside pytest at the lowest CPU priority (nice 19: they take what pytest leaves idle, about 1 %
# of a core while it wants both) and finish at full speed once it is done. Each part prints its
# start time; the background part's log follows pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
part() { echo "[test] $* (at $(( $(date +%s) - start )) s)"; }

part "bootstrap"
scripts/bootstrap.sh

part "the C++ core's include graph"
.venv/bin/python scripts/include_graph.py

mkdir -p build/logs
core_log=build/logs/core-tests.log
part "C++ core under ASan+UBSan (build/sanitize) and a bounded fuzz pass, in the background: $core_log"
# The fuzz pass is bounded by executions (as many as 60 s give on an idle core), not by time: under
# pytest's load a time bound would fuzz less. timeout bounds everything else.
(
  set -e
  nice -n 19 scripts/sanitize.sh
  nice -n 19 timeout 900 scripts/fuzz.sh 900 "${FUZZ_RUNS:-15000}"
) > "$core_log" 2>&1 &
core=$!
# The background part dies with this script (a failing pytest, an interrupt).
trap 'kill $core 2>/dev/null || true' EXIT

part "Python (pytest)"
# --durations: the slowest tests, so that a CI log shows where the time goes. Two workers, one
# file each at a time (a file's module fixtures are built once): most of a test's time is the
# exporter's Python, one core each.
.venv/bin/python -m pytest -q -n "${PYTEST_WORKERS:-2}" --dist loadfile --durations=20 tests/python "$@"

part "waiting for the C++ core's tests"
core_rc=0
wait $core || core_rc=$?
trap - EXIT
cat "$core_log"
if [ "$core_rc" -ne 0 ]; then
  part "the C++ core's tests FAILED (exit $core_rc)"
  exit "$core_rc"
fi

part "the wheel, installed outside the checkout"
scripts/check_wheel.sh
part "done"
