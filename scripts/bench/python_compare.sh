#!/usr/bin/env bash
# Issue 19's figures: the Python front end against the Rust trainer and against plain PyTorch with local
# nn.EmbeddingBag tables, same data, same DLRM configuration, interleaved rounds:
#   trainer demo                                  (Rust trainer, 2 local servers)
#   python -m pstrain.demo                        (dense layers in PyTorch, tables on 2 local servers)
#   python -m pstrain.demo --local-embeddings     (the same PyTorch model with local nn.EmbeddingBag tables)
# Prints one line per run (samples/s, AUC, and for pstrain the per-batch pull/push/wait milliseconds) and keeps
# the summaries under OUT.
#
# Usage: scripts/bench/python_compare.sh [OUT]
#   env: ROWS (training rows, 300000), TEST_ROWS (50000), ROUNDS (2), PSTRAIN_VENV (/var/tmp/pstrain-venv),
#        R (binaries: $CARGO_TARGET_DIR/release or target/release), EXTRA (flags for every run)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /var/tmp/pycompare.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
R=${R:-${CARGO_TARGET_DIR:-target}/release}
PY=${PSTRAIN_VENV:-/var/tmp/pstrain-venv}/bin/python
ROWS=${ROWS:-300000}
TEST_ROWS=${TEST_ROWS:-50000}
export PSTRAIN_BIN_DIR=$R
data=(--rows "$ROWS" --test-rows "$TEST_ROWS" --data-dir "$OUT/data")
show() {
  "$PY" -c 'import json, sys
s = json.load(open(sys.argv[2]))
extra = "".join(f" {k}={s[k]:.1f}" for k in ("pull_ms_per_batch", "push_ms_per_batch", "wait_ms_per_batch") if k in s)
sps, auc, ll = s["samples_per_sec"], s["auc"], s["logloss"]
print(f"{sys.argv[1]:<10} samples_per_s={sps:.0f} auc={auc:.4f} logloss={ll:.4f}{extra}")' "$@"
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  "$R/trainer" demo "${data[@]}" --summary-json "$OUT/rust-$r.json" ${EXTRA:-} >"$OUT/rust-$r.log" 2>&1
  show rust "$OUT/rust-$r.json"
  (cd "$OUT" && "$PY" -m pstrain.demo "${data[@]}" --summary-json "$OUT/pstrain-$r.json" ${EXTRA:-} >"$OUT/pstrain-$r.log" 2>&1)
  show pstrain "$OUT/pstrain-$r.json"
  (cd "$OUT" && "$PY" -m pstrain.demo "${data[@]}" --local-embeddings --summary-json "$OUT/local-$r.json" ${EXTRA:-} >"$OUT/local-$r.log" 2>&1)
  show local "$OUT/local-$r.json"
done
