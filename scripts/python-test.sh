#!/usr/bin/env bash
# The Python package's tests (python/tests, pytest) with real PyTorch and TorchRec, as `make test` runs them:
#   1. a virtual environment OUTSIDE the clone (PSTRAIN_VENV, default /var/tmp/pstrain-venv-torchrec), created once
#      and reused, holding exactly the pinned versions below (checked every run, fixed when they differ);
#   2. the ps-server, gen-criteo, trainer and ps-serve binaries the tests start (release build);
#   3. `pip install ./python` (maturin builds the PyO3 extension against the same target directory);
#   4. pytest, from outside the source folder so the installed package is the one imported.
#
# Why these pins (measured on Debian 12, CPU only, PyPI): torchrec 1.9.2 needs torch 2.14.x; its dependency pulls
# the CUDA fbgemm-gpu, which does not load without NVIDIA's libraries, so it is replaced by fbgemm-gpu-cpu 1.9.0
# (installed with --no-deps); with torch 2.15.0 that fbgemm-gpu-cpu fails to load (undefined symbol). torch from
# PyPI is the CUDA build (~4 GB download once) and runs on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PSTRAIN_VENV:-/var/tmp/pstrain-venv-torchrec}
PY=${PYTHON:-python3}
TORCH=2.14.1
TORCHREC=1.9.2
FBGEMM_CPU=1.9.0
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating the Python test environment in $VENV (torch is large: this takes minutes once)"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip
# Prints what differs from the pins (nothing when the environment is right).
check() {
  "$VPY" - "$TORCH" "$TORCHREC" "$FBGEMM_CPU" <<'PYEOF'
import sys
from importlib import metadata
want = {"torch": sys.argv[1], "torchrec": sys.argv[2], "fbgemm-gpu-cpu": sys.argv[3]}
for name in ("numpy", "pytest", "maturin", "tensorboard", "safetensors"):
    want.setdefault(name, None)
for name, version in want.items():
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        print(f"{name}: missing")
        continue
    if version is not None and have.split("+")[0] != version:
        print(f"{name}: {have}, want {version}")
try:
    metadata.version("fbgemm-gpu")
    print("fbgemm-gpu (the CUDA build) is installed")
except metadata.PackageNotFoundError:
    pass
PYEOF
}
wrong=$(check)
if [ -n "$wrong" ]; then
  echo "fixing the Python test environment: $wrong" | tr '\n' ' '; echo
  "$VPY" -m pip install -q numpy pytest maturin tensorboard safetensors "torch==$TORCH" "torchrec==$TORCHREC"
  "$VPY" -m pip uninstall -q -y fbgemm-gpu >/dev/null 2>&1 || true
  "$VPY" -m pip install -q --no-deps --force-reinstall "fbgemm-gpu-cpu==$FBGEMM_CPU"
  wrong=$(check)
  if [ -n "$wrong" ]; then
    echo "the Python test environment in $VENV is still wrong: $wrong" >&2
    exit 1
  fi
fi
"$VPY" -c "import torch, torchrec, fbgemm_gpu" || {
  echo "torchrec does not import in $VENV (see the pins in $0)" >&2
  exit 1
}
cargo build --release -p ps-server -p bench -p trainer -p serving --bin ps-server --bin gen-criteo --bin trainer --bin ps-serve
"$VPY" -m pip install -q ./python
export PSTRAIN_BIN_DIR="${CARGO_TARGET_DIR:-$PWD/target}/release"
cd python/tests
exec "$VPY" -m pytest -q -p no:cacheprovider -W ignore::DeprecationWarning .
