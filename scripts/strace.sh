#!/usr/bin/env bash
# Make sure strace is installed (Debian's package), for scripts/ack_order.py and its test
# (tests/test_ack_order.py), which trace a real node's syscalls to check that it
# acknowledges nothing before the fdatasync of the journal record holding it.
# Prints the path of strace. Exit 1 if it is missing and cannot be installed (no apt-get,
# or not root and no sudo).
set -euo pipefail

if ! command -v strace >/dev/null; then
  if ! command -v apt-get >/dev/null; then
    echo "strace.sh: no strace here, and no apt-get to install it" >&2
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "strace.sh: installing strace needs root" >&2; exit 1; }
    sudo="sudo"
  fi
  echo "strace.sh: installing strace from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q >&2
  $sudo apt-get install -y -q --no-install-recommends strace >&2
fi
command -v strace
