#!/usr/bin/env bash
# Set up (or reuse) .venv with eomsg and its dev extras, make sure PostgreSQL's server is
# installed (the tests start a throwaway one), then run the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
if ! bash scripts/postgres.sh >/dev/null; then
  if [ "${CI:-}" = true ]; then
    echo "test.sh: PostgreSQL is needed under CI=true" >&2
    exit 1
  fi
  echo "test.sh: no PostgreSQL server: its tests are skipped" >&2
fi
python -m ruff check eomsg tests scripts
python -m mypy eomsg
python -m pytest "$@"
