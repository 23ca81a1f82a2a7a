#!/usr/bin/env bash
# SecretFlow's SGB for benchmarks/peers/sgb.py: secretflow-lite 1.13.0b0 in its own Python 3.10 environment at
# runs/peers/sgb-venv (never in vflo's). PYTHON310=/path/to/python3.10 picks the interpreter; else python3.10 on
# PATH, then pyenv's. Without one it says so and exits 0, and the benchmark then records why it did not run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
VENV="${SGB_VENV:-runs/peers/sgb-venv}"
find_python() {
  if [ -n "${PYTHON310:-}" ]; then echo "$PYTHON310"; return; fi
  if command -v python3.10 >/dev/null && python3.10 -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
    command -v python3.10; return
  fi
  for p in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10.*/bin/python3.10; do
    if [ -x "$p" ]; then echo "$p"; return; fi
  done
}
PY="$(find_python || true)"
if [ -z "$PY" ]; then
  echo "skipped: no Python 3.10 on this machine (set PYTHON310=/path/to/python3.10); SecretFlow's SGB is not installed"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q secretflow-lite==1.13.0b0
"$VENV/bin/python" -c 'import secretflow; print("secretflow", secretflow.__version__, "in", "'"$VENV"'")'
