#!/usr/bin/env bash
# Make sure PostgreSQL's server programs are installed (Debian's package), for the tests
# and benchmarks that run a real server: tests/conftest.py starts a throwaway cluster
# with them (scripts/pgcluster.py), unless EOMSG_TEST_PG names a server already running.
# Prints the directory of the server programs. Exit 1 if they are missing and cannot be
# installed (no apt-get, or not root and no sudo).
set -euo pipefail

server_bin() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/postgres" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}

if ! server_bin >/dev/null; then
  # Whether the package starts a cluster of its own does not matter: the tests start
  # theirs on a socket directory and port of their own.
  bash "$(dirname "$0")/debian.sh" --install postgresql
fi
server_bin
