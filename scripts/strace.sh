#!/usr/bin/env bash
# Make sure strace is installed (Debian's package), for scripts/ack_order.py and its test
# (tests/test_ack_order.py), which trace a real node's syscalls to check that it
# acknowledges nothing before the fdatasync of the journal record holding it.
# Prints the path of strace. Exit 1 if it is missing and cannot be installed.
set -euo pipefail
exec bash "$(dirname "$0")/debian.sh" strace strace
