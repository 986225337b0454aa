#!/usr/bin/env bash
# shellcheck disable=SC2317  # the parts below run through `bash -c`, which shellcheck cannot follow
# The GPU checks, for a machine with an NVIDIA GPU, in profiles that each fit one call. Installs
# nothing (such machines may have no package registry and no virtual environment): builds
# torch_ort's extensions, then runs the parts of the profile, most informative first, and writes
# under ${OUT:-benchmarks/results/gpu} as it goes (a run cut short still reports):
#   summary.md              each part: outcome, seconds, its last line; failed tests by name
#   logs.tar.gz             every part's log, pytest's JUnit XML, the examples' plots
#   gpu_probe.{json,md}     the probe: nanoGPT-124M bf16 steps looked into (docs/gpu.md)
#   gpu_suite*.{json,md,png} the benchmark
# Usage:
#   scripts/gpu_check.sh                          # --profile first: build, probe, core tests, small-GPT bench
#   scripts/gpu_check.sh --profile second         # build, the other tests, the examples, the other bench cases
#   scripts/gpu_check.sh --parts build,tests-core # any of the parts below, in the order given
#   scripts/gpu_check.sh --budget 900             # seconds for everything (default: the profile's)
#   scripts/gpu_check.sh --carry                  # the ignored paths a copy of the tree needs (docs/gpu.md)
#   scripts/gpu_check.sh --dry-run ...            # compile nothing; see scripts/gpu_dry_run.py
# Parts: build diagnose probe tests-core tests-rest examples bench-first bench-second cpu-tests.
# Each part runs with what is left of the budget (some with a cap of their own); the benchmark
# starts no variant after the budget and says which it did not run. Python: python3 (or $PYTHON);
# this checkout is put on PYTHONPATH, so nothing needs to be installed. MAX_JOBS defaults to the
# core count, TORCH_CUDA_ARCH_LIST to the GPU's compute capability.
set -uo pipefail  # not -e: a failed part is recorded and the next one still runs
cd "$(dirname "$0")/.." || exit 1

# The ignored paths the build needs beside the tracked files: the private protobuf-lite and the
# ONNX arity table of a checkout bootstrapped on the same commit (scripts/build_protobuf.py).
CARRY=(build/third_party/protobuf-lite build/generated)

PROFILE=first
PARTS=""
BUDGET=""
DRY_RUN=0
BENCH_ARGS=()
while (($#)); do
  case $1 in
    --profile) PROFILE=$2; shift 2 ;;
    --parts) PARTS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --carry) printf '%s\n' "${CARRY[@]}"; exit 0 ;;
    --) shift; BENCH_ARGS=("$@"); break ;;
    -h|--help) sed -n '3,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
case $PROFILE in
  first) : "${PARTS:=build,diagnose,probe,tests-core,bench-first}" "${BUDGET:=450}" ;;
  second) : "${PARTS:=build,diagnose,tests-rest,examples,bench-second}" "${BUDGET:=540}" ;;
  *) echo "gpu_check: unknown profile '$PROFILE' (first, second)" >&2; exit 2 ;;
esac
for p in ${PARTS//,/ }; do
  case $p in
    build|diagnose|probe|tests-core|tests-rest|examples|bench-first|bench-second|cpu-tests) ;;
    *) echo "gpu_check: unknown part '$p'" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
ROOT=$PWD
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # `import torch_ort` from every process, no .pth
OUT_DIR=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOGS=$(mktemp -d)     # packed into logs.tar.gz after every part: $OUT takes few files
SCRATCH=$(mktemp -d)  # the examples' checkpoints: not worth bringing back
trap 'rm -rf "$LOGS" "$SCRATCH"' EXIT
START=$(date +%s)
RESERVE=15  # seconds kept for the last summary and packing
SUMMARY=$OUT_DIR/summary.md
export ORTMODULE_FALLBACK_POLICY=FALLBACK_DISABLE  # an engine failure fails, never runs eager as ours
# Printed by a process that scripts/gpu_dry_run.py stopped at its first CUDA call (benchmarks/common.py).
DRY_RUN_MARK="[gpu dry run] stopped at the first CUDA call"
failed=0

{
  echo "# GPU checks, $(date -u '+%Y-%m-%d %H:%M UTC')$( ((DRY_RUN)) && echo ' (dry run: no GPU, nothing compiled)')"
  echo
  $PY - <<'EOF' 2>&1
import platform, torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU visible"
print(f"{gpu} · torch {torch.__version__} (CUDA {torch.version.cuda}) · Python {platform.python_version()}")
EOF
  echo
  echo "Profile $PROFILE; parts: $PARTS; budget ${BUDGET} s; commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)."
  echo
  echo "| part | outcome | seconds | last line |"
  echo "|---|---|---|---|"
} > "$SUMMARY" 2>&1

pack() { tar -czf "$OUT_DIR/logs.tar.gz" -C "$LOGS" . 2>/dev/null; }
left() { echo $((START + BUDGET - RESERVE - $(date +%s))); }

# part NAME CAP COMMAND...: runs COMMAND (a function below, or a program) for at most CAP seconds
# (0: no cap of its own) and what is left of the budget, logs it to NAME.log and adds its row to
# the summary. In a dry run a process stopped at its first CUDA call has done all it could.
part() {
  local name=$1 cap=$2; shift 2
  local log=$LOGS/$name.log budget outcome rc t0
  budget=$(left)
  ((cap > 0 && cap < budget)) && budget=$cap
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
    *) if ((DRY_RUN)) && grep -qF "$DRY_RUN_MARK" "$log"; then outcome="passed (dry run: reached the GPU)"
       else outcome="failed (exit $rc)"; failed=1; fi ;;
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
  if ((DRY_RUN)); then  # offline, from what was carried; the extension is the checkout's own
    $PY scripts/build_protobuf.py && echo "dry run: protobuf-lite and the arity table are there; nothing compiled"
    return
  fi
  if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
    local arch
    arch=$($PY -c 'import torch; c = torch.cuda.get_device_capability() if torch.cuda.is_available() else None; print(f"{c[0]}.{c[1]}" if c else "")')
    [ -n "$arch" ] && export TORCH_CUDA_ARCH_LIST=$arch
  fi
  echo "MAX_JOBS=$MAX_JOBS TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-unset, setup.py default}"
  $PY setup.py build_ext --inplace
}
pytest_part() {  # pytest_part NAME FILE... [-k EXPR]
  local name=$1; shift
  $PY -m pytest -q -rfEs -p no:cacheprovider "$@" --junitxml="$LOGS/$name.xml"
}
torchrun() { $PY -m torch.distributed.run --standalone --nproc_per_node=1 "$@"; }
suite() { $PY benchmarks/gpu_suite.py --out "$OUT_DIR" --stop-at "$((START + BUDGET - RESERVE - 10))" "$@"; }
export -f build pytest_part torchrun suite
export PY LOGS SCRATCH DRY_RUN START BUDGET RESERVE OUT_DIR

for p in ${PARTS//,/ }; do
  case $p in
    build) part build 0 bash -c build ;;
    diagnose)  # python -m torch_ort: versions, the extensions, a CUDA training step against eager
      part diagnose 60 $PY -m torch_ort ;;
    probe)  # nanoGPT-124M bf16: what a steady step does, per variant (about a minute)
      part probe 150 bash -c "suite --name gpu_probe --cases nanogpt --variants eager,ortmodule,ortmodule_cg \
        --steps 10 --warmup 3 --probe --no-gemm" ;;
    tests-core)  # host synchronizations, CUDA graphs, autocast's loss dtype, attention, the fused head's rows
      part tests-core 0 bash -c "pytest_part tests-core tests/python/test_gpu_sync_free.py \
        tests/python/test_gpu_cuda_graphs.py tests/python/test_attention_dropout.py \
        tests/python/test_fusion_attention.py::test_attention_reads_grouped_keys_and_values_unrepeated \
        tests/python/test_linear_cross_entropy.py::test_the_aten_rows_on_cuda_match_eager \
        tests/python/test_gpu_parity.py::test_autocast_loss_dtype_and_value_match_eager" ;;
    tests-rest)
      part tests-rest 0 bash -c "pytest_part tests-rest tests/python/test_gpu_parity.py -k 'not autocast' \
        tests/python/test_optim_cuda.py" ;;
    examples)
      if $PY -c 'import sklearn' 2>/dev/null; then
        part example_getting_started 0 $PY examples/getting_started.py --device cuda --steps 100
      else
        skip example_getting_started "scikit-learn (its digits data) is not installed"
      fi
      part example_huggingface_gpt2 0 $PY examples/huggingface_gpt2.py --device cuda --steps 40 \
        --finetune-steps 20 --eval-batches 2 --quiet --out-dir "$SCRATCH/huggingface_gpt2"
      [ -f "$SCRATCH/huggingface_gpt2/loss.png" ] && cp "$SCRATCH/huggingface_gpt2/loss.png" "$LOGS/huggingface_gpt2_loss.png"
      part example_ddp_training_nccl 0 bash -c "torchrun examples/ddp_training.py --device cuda --steps 30 \
        --data-mb 0.5 --checkpoint '$SCRATCH/ddp.pt'"
      part example_bert_pretraining_nccl 0 bash -c "torchrun examples/bert_pretraining.py --device cuda \
        --steps 10 --log-every 5 --checkpoint-dir '$SCRATCH/bert'" ;;
    bench-first)  # the small GPT's overhead-bound step, with and without CUDA graphs
      part bench-first 0 bash -c 'suite "$@"' suite --name gpu_suite_first --cases small \
        --variants eager,ortmodule_cg,compile_ro,ortmodule,compile --no-gemm "${BENCH_ARGS[@]}" ;;
    bench-second)
      part bench-second 0 bash -c 'suite "$@"' suite --name gpu_suite_second --cases gpt2,bert,nanogpt \
        --variants eager,ortmodule,compile,ortmodule_fused "${BENCH_ARGS[@]}" ;;
    cpu-tests)
      part cpu-tests 0 bash -c "pytest_part cpu-tests tests/python/test_parity.py tests/python/test_models.py \
        tests/python/test_autocast.py" ;;
  esac
done

if [ -s "$LOGS/failures" ]; then
  { echo; echo "Failed tests:"; echo; cat "$LOGS/failures"; } >> "$SUMMARY"
fi
for f in gpu_probe gpu_suite_first gpu_suite_second; do
  [ -f "$OUT_DIR/$f.md" ] && { echo; echo "Results: $f.md (goals first)."; } >> "$SUMMARY"
done
pack
echo "[gpu_check] done in $(($(date +%s) - START)) s; $SUMMARY"
exit $failed
