#!/usr/bin/env bash
# Make sure what `python scripts/bench.py --peers` needs is installed: Debian's
# redis-server and rabbitmq-server (with Erlang's epmd), and the `bench` extra of
# pyproject.toml (redis-py with hiredis, pika, matplotlib) in the Python that runs the
# benchmark ($PYTHON, else python3). The benchmark starts servers of its own, as child
# processes on free loopback ports: the packages' own services must not stay running, so
# they are kept from starting while the packages install (policy-rc.d), and stopped if
# they run all the same. Exit 1, with a one-line reason, if something cannot be installed
# (no apt-get, or not root and no sudo).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}

servers_missing() {
  [ -x /usr/bin/redis-server ] && [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] \
    && [ -x /usr/bin/epmd ] && return 1
  return 0
}

stop_service() {
  # The package's service, if its postinst started it anyway (systemd or SysV init).
  local name="$1"
  if command -v systemctl >/dev/null && systemctl is-active --quiet "$name" 2>/dev/null; then
    echo "peers.sh: stopping the $name service that the package started" >&2
    $sudo systemctl stop "$name" >&2 || true
  elif [ -x "/etc/init.d/$name" ] && "/etc/init.d/$name" status >/dev/null 2>&1; then
    echo "peers.sh: stopping the $name service that the package started" >&2
    $sudo "/etc/init.d/$name" stop >&2 || true
  fi
}

sudo=""
if servers_missing; then
  if ! command -v apt-get >/dev/null; then
    echo "peers.sh: redis-server or rabbitmq-server is missing, and no apt-get to install them" >&2
    exit 1
  fi
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "peers.sh: installing redis-server and rabbitmq-server needs root" >&2; exit 1; }
    sudo="sudo"
  fi
  policy=/usr/sbin/policy-rc.d
  backup=""
  if [ -e "$policy" ]; then
    backup=$(mktemp /tmp/policy-rc.d.XXXXXX)
    $sudo cp -p "$policy" "$backup"
  fi
  restore_policy() {
    if [ -n "$backup" ]; then
      $sudo cp -p "$backup" "$policy" && rm -f "$backup"
    else
      $sudo rm -f "$policy"
    fi
  }
  trap restore_policy EXIT
  # 101: "action not allowed": invoke-rc.d and deb-systemd-invoke start no service.
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  echo "peers.sh: installing redis-server and rabbitmq-server from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q >&2
  $sudo apt-get install -y -q --no-install-recommends redis-server rabbitmq-server erlang-base >&2
  restore_policy
  trap - EXIT
  stop_service redis-server
  stop_service rabbitmq-server
  servers_missing && { echo "peers.sh: the servers are still missing after installing them" >&2; exit 1; }
fi

if ! "$python" -c 'import redis, hiredis, pika, matplotlib' 2>/dev/null; then
  # The pins of pyproject.toml's `bench` extra, without reinstalling eomsg itself.
  spec=$("$python" - "$root/pyproject.toml" <<'EOF'
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["bench"]))
EOF
)
  echo "peers.sh: installing the bench extra into $("$python" -c 'import sys; print(sys.prefix)'):" $spec >&2
  mapfile -t packages <<<"$spec"
  "$python" -m pip install --quiet "${packages[@]}" >&2
fi
echo "redis-server: /usr/bin/redis-server; rabbitmq-server: /usr/lib/rabbitmq/bin/rabbitmq-server" >&2
