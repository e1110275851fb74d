# Sourced by the other scripts: a virtualenv with the project and its pinned dependencies.
# Re-installs only when pyproject.toml or constraints.txt changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ROVER_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtualenv $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
want="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$VENV/.rover-installed" 2>/dev/null || true)" != "$want" ]; then
  echo "installing airflow-rover and its dependencies into $VENV (a few minutes the first time)" >&2
  log="$VENV/install.log"
  if ! { "$VENV/bin/python" -m pip install --upgrade pip &&
         "$VENV/bin/python" -m pip install -c "$ROOT/constraints.txt" -e "$ROOT[dev]"; } > "$log" 2>&1; then
    tail -40 "$log" >&2
    echo "installation failed; full log: $log" >&2
    exit 1
  fi
  echo "$want" > "$VENV/.rover-installed"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
