#!/usr/bin/env bash
# The main job: installs what it needs, then trains the getting-started model with ORTModule next
# to eager PyTorch. Extra arguments go to the example (e.g. --steps 500).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python examples/getting_started.py "$@"
