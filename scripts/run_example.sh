#!/usr/bin/env bash
# The main job: installs what it needs, then trains a small Hugging Face GPT-2 with ORTModule on the
# Python standard library's own source files, read byte-level (no download), through ORTModule and
# in eager PyTorch, side by side. Extra arguments go to the example (e.g. --eager: only the eager
# PyTorch run, --no-eager: only the ORTModule run, --steps 1000). examples/getting_started.py is
# the smaller MLP example (run it with .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python examples/huggingface_gpt2.py "$@"
