# Sourced by the other scripts: a virtualenv with the project and its pinned dependencies.
# Re-installs only when pyproject.toml, constraints.txt or the C loops' build changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ROVER_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

# pip's latest step in its log, in one short line: how many packages it resolved, what now.
pip_step() {
  local resolved last
  resolved=$(grep -c '^Collecting ' "$1" || true)
  last=$(grep -E '^ *(Collecting|Downloading|Building|Installing collected|Successfully)' "$1" |
         tail -1 | sed -e 's/^ *//' -e 's/ (from .*//' | cut -c1-80 || true)
  echo "$resolved packages resolved; ${last:-starting}"
}

# Run "$@" with its output appended to $log, saying every 10 s what it is at.
with_progress() {
  local what="$1" pid waited=0
  shift
  echo "  $what" >&2
  "$@" >> "$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    waited=$((waited + 1))
    if [ $((waited % 10)) -eq 0 ] && kill -0 "$pid" 2>/dev/null; then
      echo "    ${waited} s: $(pip_step "$log")" >&2
    fi
  done
  wait "$pid"
}

if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtualenv $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
# setup.py builds the id index's C loops in place: a change to them re-installs too.
want="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" "$ROOT/setup.py" \
  "$ROOT/airflow_rover/core/_id_probe.c" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$VENV/.rover-installed" 2>/dev/null || true)" != "$want" ]; then
  log="$VENV/install.log"
  : > "$log"
  echo "installing airflow-rover and its dependencies into $VENV" \
    "(a few minutes the first time; pip's log: $log)" >&2
  if ! { with_progress "upgrading pip" "$VENV/bin/python" -m pip install --upgrade pip &&
         with_progress "installing the project and its pinned dependencies" \
           "$VENV/bin/python" -m pip install -c "$ROOT/constraints.txt" -e "$ROOT[dev]"; }; then
    tail -40 "$log" >&2
    echo "installation failed; full log: $log" >&2
    exit 1
  fi
  echo "$want" > "$VENV/.rover-installed"
  echo "  done: $(grep -c '^Collecting ' "$log" || true) packages, ${SECONDS} s" >&2
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
