# Sourced by the scripts: create .venv if missing, install eomsg with its dev and spark extras when
# pyproject.toml changed since the last install, and activate it.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
stamp=.venv/.eomsg-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install --quiet --upgrade pip
  python -m pip install --quiet -e '.[dev,spark]'
  touch "$stamp"
fi
