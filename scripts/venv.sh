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
# Compile eomsg's modules now: with PYTHONDONTWRITEBYTECODE set (some machines set it for
# everyone) every eomsg process would compile them again, some 0.14 s a command.
python -m compileall -q eomsg >/dev/null
