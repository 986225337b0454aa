#!/usr/bin/env bash
# shellcheck disable=SC2317  # the parts below run through `bash -c`, which shellcheck cannot follow
# The GPU checks in one command, for a machine with an NVIDIA GPU. Installs nothing (such machines
# may have no package registry): builds torch_ort's extensions, runs the GPU tests, every example on
# the GPU and benchmarks/gpu_suite.py, and writes under ${OUT:-benchmarks/results/gpu}:
#   summary.md              each part: outcome, seconds, its last line; failed tests by name
#   logs.tar.gz             every part's log, pytest's JUnit XML, the examples' plots
#   gpu_suite.{json,md,png} the benchmark (docs/gpu.md)
# Usage:
#   scripts/gpu_check.sh                                  # build, tests, examples, bench
#   scripts/gpu_check.sh --parts build,tests              # any of: build tests cpu-tests examples bench
#   scripts/gpu_check.sh --parts build,bench -- --cases small,nanogpt   # after --: gpu_suite.py arguments
#   scripts/gpu_check.sh --budget 1800                    # seconds for everything (default 540)
# Each part runs with what is left of --budget; the benchmark starts no variant after the budget
# and says which it did not run. On an H200 with 16 cores: build under 1 min, tests ~3 min,
# examples ~2 min, the whole benchmark ~8 min — so in one 9-minute go the benchmark gets what is
# left; run `--parts build,bench` on its own for all of it. cpu-tests (the CPU parity tests:
# test_parity, test_models, test_autocast) is not in the default set.
# Needs the protobuf artefacts of a bootstrapped checkout (build/third_party/protobuf-lite,
# build/generated). Python: .venv/bin/python if present, else python3. MAX_JOBS defaults to the
# core count, TORCH_CUDA_ARCH_LIST to the GPU's compute capability.
set -uo pipefail  # not -e: a failed part is recorded and the next one still runs
cd "$(dirname "$0")/.." || exit 1

PARTS=build,tests,examples,bench
BUDGET=540
BENCH_ARGS=()
while (($#)); do
  case $1 in
    --parts) PARTS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --) shift; BENCH_ARGS=("$@"); break ;;
    -h|--help) sed -n '3,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
for p in ${PARTS//,/ }; do
  case $p in build|tests|cpu-tests|examples|bench) ;; *) echo "gpu_check: unknown part '$p'" >&2; exit 2 ;; esac
done
has_part() { [[ ",$PARTS," == *",$1,"* ]]; }

PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
OUT_DIR=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOGS=$(mktemp -d)     # packed into logs.tar.gz after every part: $OUT takes few files
SCRATCH=$(mktemp -d)  # the examples' checkpoints: not worth bringing back
trap 'rm -rf "$LOGS" "$SCRATCH"' EXIT
START=$(date +%s)
RESERVE=20  # seconds kept for the last summary and packing
SUMMARY=$OUT_DIR/summary.md
export ORTMODULE_FALLBACK_POLICY=FALLBACK_DISABLE  # an engine failure fails, never runs eager as ours
failed=0

{
  echo "# GPU checks, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  $PY - <<'EOF' 2>&1
import platform, torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU visible"
print(f"{gpu} · torch {torch.__version__} (CUDA {torch.version.cuda}) · Python {platform.python_version()}")
EOF
  echo
  echo "Parts: $PARTS; budget ${BUDGET} s; commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)."
  echo
  echo "| part | outcome | seconds | last line |"
  echo "|---|---|---|---|"
} > "$SUMMARY"

pack() { tar -czf "$OUT_DIR/logs.tar.gz" -C "$LOGS" . 2>/dev/null; }
left() { echo $((START + BUDGET - RESERVE - $(date +%s))); }

# part NAME COMMAND...: runs COMMAND (a function below, or a program) with what is left of the
# budget, logs it to NAME.log and adds its row to the summary.
part() {
  local name=$1; shift
  local log=$LOGS/$name.log budget outcome rc t0
  budget=$(left)
  if ((budget < 15)); then
    echo "| $name | not run: the budget was spent | | |" >> "$SUMMARY"
    echo "[gpu_check] $name: not run (budget spent)"
    return
  fi
  echo "[gpu_check] $name (at most ${budget} s; log: $name.log)"
  t0=$(date +%s)
  timeout --kill-after=10 "$budget" "$@" > "$log" 2>&1
  rc=$?
  case $rc in
    0) outcome=passed ;;
    124|137) outcome="stopped: out of time"; failed=1 ;;
    *) outcome="failed (exit $rc)"; failed=1 ;;
  esac
  local last
  last=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-240 | tr '|' '/')
  echo "| $name | $outcome | $(($(date +%s) - t0)) | $last |" >> "$SUMMARY"
  grep -E '^(FAILED|ERROR) ' "$log" | sed "s/^/    $name: /" >> "$LOGS/failures"
  echo "[gpu_check] $name: $outcome"
  pack
}
skip() { echo "| $1 | skipped: $2 | | |" >> "$SUMMARY"; echo "[gpu_check] $1: skipped ($2)"; }

# --- the parts (functions exported so that timeout can run them in a bash of their own) ---------
build() {
  export MAX_JOBS=${MAX_JOBS:-$(nproc)}
  if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
    local arch
    arch=$($PY -c 'import torch; c = torch.cuda.get_device_capability() if torch.cuda.is_available() else None; print(f"{c[0]}.{c[1]}" if c else "")')
    [ -n "$arch" ] && export TORCH_CUDA_ARCH_LIST=$arch
  fi
  echo "MAX_JOBS=$MAX_JOBS TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-unset, setup.py default}"
  $PY setup.py build_ext --inplace
}
gpu_tests() {
  $PY -m pytest -q -rfEs tests/python/test_gpu*.py tests/python/test_optim_cuda.py --junitxml="$LOGS/gpu_tests.xml"
}
cpu_tests() {
  $PY -m pytest -q -rfEs tests/python/test_parity.py tests/python/test_models.py tests/python/test_autocast.py \
    --junitxml="$LOGS/cpu_tests.xml"
}
torchrun() { $PY -m torch.distributed.run --standalone --nproc_per_node=1 "$@"; }
export -f build gpu_tests cpu_tests torchrun
export PY LOGS SCRATCH

if has_part build; then part build bash -c build; fi
if has_part tests; then part tests bash -c gpu_tests; fi
if has_part examples; then
  if $PY -c 'import sklearn' 2>/dev/null; then
    part example_getting_started $PY examples/getting_started.py --device cuda --steps 100
  else
    skip example_getting_started "scikit-learn (its digits data) is not installed"
  fi
  part example_huggingface_gpt2 $PY examples/huggingface_gpt2.py --device cuda --steps 40 --finetune-steps 20 \
    --eval-batches 2 --quiet --out-dir "$SCRATCH/huggingface_gpt2"
  [ -f "$SCRATCH/huggingface_gpt2/loss.png" ] && cp "$SCRATCH/huggingface_gpt2/loss.png" "$LOGS/huggingface_gpt2_loss.png"
  part example_ddp_training_nccl bash -c "torchrun examples/ddp_training.py --device cuda --steps 30 --data-mb 0.5 \
    --checkpoint '$SCRATCH/ddp.pt'"
  part example_ddp_training_nccl_eager bash -c "torchrun examples/ddp_training.py --device cuda --steps 30 \
    --data-mb 0.5 --eager"
  part example_bert_pretraining_nccl bash -c "torchrun examples/bert_pretraining.py --device cuda --steps 10 \
    --log-every 5 --checkpoint-dir '$SCRATCH/bert'"
fi
if has_part bench; then  # it stops its variants 20 s before the part's end, to write its report
  part bench $PY benchmarks/gpu_suite.py --out "$OUT_DIR" --stop-at "$((START + BUDGET - RESERVE - 20))" \
    "${BENCH_ARGS[@]}"
fi
if has_part cpu-tests; then part cpu-tests bash -c cpu_tests; fi

if [ -s "$LOGS/failures" ]; then
  { echo; echo "Failed tests:"; echo; cat "$LOGS/failures"; } >> "$SUMMARY"
fi
[ -f "$OUT_DIR/gpu_suite.md" ] && { echo; echo "Benchmark: gpu_suite.md (goals first)."; } >> "$SUMMARY"
pack
echo "[gpu_check] done in $(($(date +%s) - START)) s; $SUMMARY"
exit $failed
