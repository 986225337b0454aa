#!/usr/bin/env bash
# The optimizer benchmarks in one command: FusedAdam against torch.optim.AdamW and the bandwidth floor,
# then the baby-GPT bf16 training step (ORTModule + FusedAdam against eager). Installs what it needs
# first; writes benchmarks/results/{fused_adam,bf16_training}.{json,md}. Takes ~2 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
.venv/bin/python benchmarks/fused_adam.py "$@"
.venv/bin/python benchmarks/bf16_training.py "$@"
