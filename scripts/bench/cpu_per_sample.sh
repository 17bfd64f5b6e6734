#!/usr/bin/env bash
# CPU time per training sample of each process of a `trainer demo` run: the trainer and its ps-servers.
# On a shared host whose speed drifts, CPU seconds per sample move less than samples/s, and they say which
# process the time goes to.
#
# Usage: scripts/bench/cpu_per_sample.sh LABEL [extra `trainer demo` flags]
#   env: TRAIN (default data/demo/train-1000000-s1-t7.cols, made by scripts/bench/pytorch_compare.sh), TEST
#        (data/demo/test-100000-s2-t7.tsv), OPT (sgd), BIN (${CARGO_TARGET_DIR:-target}/release)
# Prints: LABEL samples/s, test AUC, trainer and ps-server CPU microseconds per sample (user + system, from
# /proc/PID/stat, sampled every 0.2 s until the final evaluation starts), and wall microseconds per sample.
set -euo pipefail
cd "$(dirname "$0")/../.."
label=${1:?usage: $0 LABEL [trainer demo flags]}
shift
B=${BIN:-${CARGO_TARGET_DIR:-target}/release}
TRAIN=${TRAIN:-data/demo/train-1000000-s1-t7.cols}
TEST=${TEST:-data/demo/test-100000-s2-t7.tsv}
for f in "$TRAIN" "$TEST"; do
    [ -e "$f" ] || { echo "missing $f: run scripts/bench/pytorch_compare.sh once, or set TRAIN/TEST" >&2; exit 2; }
done
out=$(mktemp -d /tmp/cpu-per-sample.XXXXXX)
"$B/trainer" demo --data-dir data/demo --train "$TRAIN" --test "$TEST" --optimizer "${OPT:-sgd}" \
    --summary-json "$out/summary.json" "$@" >"$out/log" 2>&1 &
pid=$!
declare -A ticks
while kill -0 "$pid" 2>/dev/null && ! grep -q '^evaluating' "$out/log"; do
    for p in "$pid" $(pgrep -P "$pid" -x ps-server || true); do
        t=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null) && ticks[$p]=$t
    done
    sleep 0.2
done
wait "$pid" || { echo "trainer demo failed; log in $out/log" >&2; exit 1; }
ps=0
for p in "${!ticks[@]}"; do [ "$p" != "$pid" ] && ps=$((ps + ticks[$p])); done
python3 - "$label" "$out/summary.json" "${ticks[$pid]:-0}" "$ps" "$(getconf CLK_TCK)" <<'PY'
import json, sys
label, path, trainer, ps, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
d = json.load(open(path))
n = d["samples"]
print(f"{label}: {d['samples_per_sec']:,.0f} samples/s, AUC {d['auc']:.4f}, "
      f"trainer CPU {trainer / hz / n * 1e6:.2f} us/sample, ps-servers CPU {ps / hz / n * 1e6:.2f} us/sample, "
      f"wall {1e6 / d['samples_per_sec']:.2f} us/sample")
PY
