#!/usr/bin/env bash
# Usage: scripts/debian.sh COMMAND PACKAGE — make sure COMMAND is installed, from Debian's
# PACKAGE if it is missing, for a test that needs it; prints the path of COMMAND.
#        scripts/debian.sh --install PACKAGE — install PACKAGE (for a caller that finds
# what it needs its own way: scripts/java.sh, scripts/postgres.sh).
# Exit 1 if it cannot be installed (no apt-get, or not root and no sudo).
set -euo pipefail

install() {
  local package="$1"
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
  $sudo apt-get install -y -q --no-install-recommends "$package" >&2
}

if [ "$1" = --install ]; then
  install "$2"
  exit 0
fi
command -v "$1" >/dev/null || install "$2"
command -v "$1"
