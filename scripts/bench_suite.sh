#!/usr/bin/env bash
# The training-step suite in one command: eager PyTorch, torch.compile and ORTModule (AdamW,
# and FusedAdam) on tiny GPT, baby GPT, GPT-2 small and BERT-mini, each variant in its own process,
# plus the machine's measured fp32/bf16 GEMM peak. Installs what it needs first; writes
# benchmarks/results/suite.{json,md,png}. Arguments go to benchmarks/suite.py (--help lists them),
# e.g. `scripts/bench_suite.sh --cases tiny,baby --steps 20`.
# Each variant's first step compiles or exports from cold caches. On a 2-core CPU, GPT-2 small is the
# long case: measured while other builds shared the cores (load ~6), its eager, torch.compile and
# ORTModule processes took 2, 4 and 2.5 minutes (torch.compile's first step 136 s against 34 s for
# an eager step); the whole suite should take roughly 15-20 minutes on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/python benchmarks/suite.py "$@"
