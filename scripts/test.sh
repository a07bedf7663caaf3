#!/usr/bin/env bash
# Set up (or reuse) .venv with eomsg and its dev and spark extras, make sure PostgreSQL's
# server (the tests start a throwaway one), Java 17+ (for Spark), strace (the
# acknowledgement-order test) and a C compiler (the power-loss shim) are installed, then
# run the whole test suite.
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
if ! bash scripts/java.sh >/dev/null; then
  if [ "${CI:-}" = true ]; then
    echo "test.sh: Java 17+ is needed for the Spark tests under CI=true" >&2
    exit 1
  fi
  echo "test.sh: no Java 17+: the Spark tests are skipped" >&2
fi
if ! bash scripts/strace.sh >/dev/null; then
  if [ "${CI:-}" = true ]; then
    echo "test.sh: strace is needed for tests/test_ack_order.py under CI=true" >&2
    exit 1
  fi
  echo "test.sh: no strace: the acknowledgement-order test is skipped" >&2
fi
compiles() { printf '#include <dlfcn.h>\nint main(void) { return 0; }\n' | cc -x c -o /dev/null - 2>/dev/null; }
if ! compiles && ! { bash scripts/debian.sh --install gcc libc6-dev && compiles; }; then
  if [ "${CI:-}" = true ]; then
    echo "test.sh: a C compiler is needed for the power-loss tests under CI=true" >&2
    exit 1
  fi
  echo "test.sh: no C compiler: the power-loss tests are skipped" >&2
fi
python -m ruff check eomsg tests scripts
python -m mypy eomsg
# Two workers a core (-n 0 after it runs them in one process): a test spends much of its
# time waiting for the processes it started (nodes, commands, Spark), and one worker a core
# left the cores a third idle. Tests sharing a module's fixture go to one worker, the
# longest first (tests/conftest.py); the 40 slowest are listed.
# At most 8: each worker running a Spark test holds a JVM of about 1 GiB.
workers=$(( $(nproc) * 2 < 8 ? $(nproc) * 2 : 8 ))
python -m pytest -n "$workers" --dist loadgroup --durations=40 "$@"
