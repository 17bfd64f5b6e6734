#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest) with real PyTorch, as `make test` runs them:
#   1. a virtual environment OUTSIDE the clone (PSTRAIN_VENV, default /var/tmp/pstrain-venv), created once and
#      reused: numpy, pytest, maturin and torch from PyPI (torch is the CUDA build, ~4 GB; it runs on the CPU);
#   2. the ps-server, gen-criteo and trainer binaries the tests start (release build);
#   3. `pip install ./python` (maturin builds the PyO3 extension against the same target directory);
#   4. pytest, from outside the source folder so the installed package is the one imported.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PSTRAIN_VENV:-/var/tmp/pstrain-venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating the Python test environment in $VENV (torch is large: this takes minutes once)"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -c "import numpy, pytest, torch, maturin, tensorboard" 2>/dev/null ||
  "$VENV/bin/python" -m pip install -q numpy pytest maturin torch tensorboard
cargo build --release -p ps-server -p bench -p trainer --bin ps-server --bin gen-criteo --bin trainer
"$VENV/bin/python" -m pip install -q ./python
export PSTRAIN_BIN_DIR="${CARGO_TARGET_DIR:-$PWD/target}/release"
cd python/tests
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider .
