#!/usr/bin/env bash
# Issue 18's figures in one run: (1) speed of two trainers pinned to one core each against one pinned trainer,
# interleaved RUNS times (default 3), f32 and bf16 reduce sums; (2) test AUC and calibration of 1, 2 and 4
# trainers at the same global batch, k = 0 and 2, on the default demo data and on data of teacher 11.
# Each line: the run, samples/s, test AUC, calibration. Per-run logs and summaries in OUT_DIR.
# Usage: scripts/bench/several_trainers.sh [OUT_DIR]
#   env: RUNS, DATA_DIR (generated data, reused; default /var/tmp/demo-data), BIN_DIR (default
#        $CARGO_TARGET_DIR/release or target/release), SKIP_BUILD=1, SKIP_AUC=1, SKIP_SPEED=1
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/var/tmp/several-trainers}
RUNS=${RUNS:-3}
DATA=${DATA_DIR:-/var/tmp/demo-data}
BIN=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
[ -n "${SKIP_BUILD:-}" ] || cargo build --release -q -p trainer -p ps-server -p bench --bins
mkdir -p "$OUT"
run() {
  local name=$1; shift
  "$BIN/trainer" demo --data-dir "$DATA" --summary-json "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  python3 - "$OUT/$name.json" "$name" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print('%-28s %8.0f samples/s  AUC %.4f  calibration %.4f' % (sys.argv[2], s['samples_per_sec'], s['auc'], s.get('calibration') or 0))
PY
}
if [ -z "${SKIP_SPEED:-}" ]; then
  echo "== speed: pinned trainers, k = 0, interleaved"
  for i in $(seq 1 "$RUNS"); do
    run "pinned-1-$i" --pin-trainers --trainers 1 --max-in-flight 0
    run "pinned-2-f32-$i" --pin-trainers --trainers 2 --max-in-flight 0 --reduce-encoding f32
    run "pinned-2-bf16-$i" --pin-trainers --trainers 2 --max-in-flight 0 --reduce-encoding bf16
  done
fi
if [ -z "${SKIP_AUC:-}" ]; then
  echo "== AUC at the same global batch (demo defaults)"
  for t in 7 11; do for k in 0 2; do for n in 1 2 4; do
    run "teacher$t-k$k-trainers$n" --teacher-seed "$t" --trainers "$n" --max-in-flight "$k"
  done; done; done
fi
