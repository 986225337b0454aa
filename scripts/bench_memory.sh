#!/usr/bin/env bash
# The memory benchmark in one command: eager PyTorch, torch.compile and ORTModule at
# ORTMODULE_MEMORY_OPT_LEVEL 0, 1 and 2 (AdamW) on baby GPT and GPT-2 small, each variant and batch
# size in its own process: peak RSS, a step's activation memory (RSS and torch's allocator), the
# memory report's predicted and measured peaks, step times, and the largest batch under a memory
# cap (4 GiB baby, 6 GiB GPT-2; doubling then bisection). Installs what it needs first; writes
# benchmarks/results/memory.{json,md,png}. Arguments go to benchmarks/memory.py (--help lists them),
# e.g. `scripts/bench_memory.sh --cases baby --cap-gb baby=3`, or `--quick` (tiny GPT, ~1 minute).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/python benchmarks/memory.py "$@"
