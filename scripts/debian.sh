#!/usr/bin/env bash
# Usage: scripts/debian.sh COMMAND PACKAGE... — make sure COMMAND is installed, from
# Debian's PACKAGEs if it is missing, for a test that needs it; prints the path of COMMAND.
#        scripts/debian.sh --install PACKAGE... — install the PACKAGEs (for a caller that
# finds what it needs its own way: scripts/java.sh, scripts/postgres.sh).
# Exit 1 if it cannot be installed (no apt-get, or not root and no sudo).
set -euo pipefail

install() {
  local package="$*"
  if ! command -v apt-get >/dev/null; then
    echo "debian.sh: $package is needed, and there is no apt-get to install it" >&2
    exit 1
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "debian.sh: installing $package needs root" >&2; exit 1; }
    sudo="sudo"
  fi
  echo "debian.sh: installing $package from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q >&2
  $sudo apt-get install -y -q --no-install-recommends "$@" >&2
}

if [ "$1" = --install ]; then
  shift
  install "$@"
  exit 0
fi
command="$1"
shift
command -v "$command" >/dev/null || install "$@"
command -v "$command"
