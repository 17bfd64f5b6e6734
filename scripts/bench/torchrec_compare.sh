#!/usr/bin/env bash
# Issue 42's figure: TorchRec's DLRM with pstrain.torchrec.EmbeddingBagCollection through 2 local servers (staleness
# 0 and 2, replay, prefetch) against the same model with TorchRec's FusedEmbeddingBagCollection (row-wise Adagrad
# fused, in process), same data, rounds interleaved with the order rotated from round to round
# (bench/pytorch/torchrec_dlrm.py). One JSON line per run; the summaries stay under OUT.
#
# Usage: scripts/bench/torchrec_compare.sh [OUT]
#   env: ROWS (300000), TEST_ROWS (50000), ROUNDS (3), PSTRAIN_VENV (/var/tmp/pstrain-venv-torchrec: torch 2.14.1,
#        torchrec 1.9.2, fbgemm-gpu-cpu 1.9.0 as scripts/python-test.sh installs), R (binaries), EXTRA (flags)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /var/tmp/trcompare.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
R=${R:-${CARGO_TARGET_DIR:-target}/release}
PY=${PSTRAIN_VENV:-/var/tmp/pstrain-venv-torchrec}/bin/python
export PSTRAIN_BIN_DIR=$R
SCRIPT=$PWD/bench/pytorch/torchrec_dlrm.py
data=(--rows "${ROWS:-300000}" --test-rows "${TEST_ROWS:-50000}" --data-dir "$OUT/data")
runs=("torchrec 0" "pstrain 0" "pstrain 2")
for r in $(seq 1 "${ROUNDS:-3}"); do
  # Round r starts at run (r - 1) mod 3, so each mode runs first, second and third in turn: on a shared machine
  # the position in a round was worth more than the difference between K = 0 and K = 2 (issue-42.md § 1g).
  for i in 0 1 2; do
    set -- ${runs[$(( (r - 1 + i) % 3 ))]}
    (cd "$OUT" && "$PY" -W ignore "$SCRIPT" --mode "$1" --staleness "$2" "${data[@]}" ${EXTRA:-} \
      --summary-json "$OUT/$1-k$2-$r.json" 2>"$OUT/$1-k$2-$r.log" | tail -1)
  done
done
