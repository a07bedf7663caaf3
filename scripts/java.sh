#!/usr/bin/env bash
# Make sure a Java 17+ runtime is there for Spark (eomsg spark-replay and its tests):
# JAVA_HOME's, else the one on PATH; if there is none (or it is older), install Debian's
# openjdk-17-jre-headless. Prints the java it found. Exit 1, with a one-line reason, if
# there is none and it cannot be installed (no apt-get, or not root and no sudo).
set -euo pipefail

java_major() {
  local java="$1" v
  v=$("$java" -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\)\.\{0,1\}\([0-9]*\).*/\1 \2/p' | head -1)
  set -- $v
  if [ "${1:-0}" = 1 ]; then echo "${2:-0}"; else echo "${1:-0}"; fi
}

find_java() {
  local java
  if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
    java="$JAVA_HOME/bin/java"
  else
    java=$(command -v java || true)
  fi
  if [ -n "$java" ] && [ "$(java_major "$java")" -ge 17 ]; then
    echo "$java"
    return 0
  fi
  return 1
}

if ! find_java >/dev/null; then
  echo "java.sh: installing Java 17 (openjdk-17-jre-headless) for Spark" >&2
  bash "$(dirname "$0")/debian.sh" --install openjdk-17-jre-headless
  unset JAVA_HOME
fi
find_java || { echo "java.sh: Java 17+ still not found after installing it" >&2; exit 1; }
