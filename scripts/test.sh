#!/usr/bin/env bash
# Set up (or reuse) .venv with eomsg and its dev extras, then run the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
python -m ruff check eomsg tests scripts
python -m mypy eomsg
python -m pytest "$@"
