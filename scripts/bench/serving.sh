#!/usr/bin/env bash
# Issue 21's serving figures in one run, on loopback:
#  1. two ps-servers (--sync-interval-secs SYNC); job 1 (`trainer train`) trains on TRAIN_ROWS rows and exports;
#  2. ps-serve loads the export and follows the servers; `serve-bench --auc` scores its answers on the test rows
#     against job 1's evaluation (same rows, same model: equal AUC);
#  3. predict latency and rows/s at 1 and 256 rows per request (serve-bench, many concurrent clients);
#  4. freshness under training load: job 2 trains on other rows (publishing its dense parameters) while
#     `freshness-probe` pushes probe rows and times push-acknowledged -> served.
# Everything shares the machine's cores (servers, trainer, ps-serve, the load generator): figures are for 2 cores.
# Usage: scripts/bench/serving.sh [OUT_DIR]
#   env: TRAIN_ROWS (200000), LOAD_ROWS (job 2, 1000000), TEST_ROWS (50000), SYNC (seconds, 1), SECONDS_EACH
#        (load duration, 15), BIN_DIR (default $CARGO_TARGET_DIR/release or target/release), SKIP_BUILD=1
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/var/tmp/serving-bench}
BIN=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
SYNC=${SYNC:-1}
SECS=${SECONDS_EACH:-15}
[ -n "${SKIP_BUILD:-}" ] || cargo build --release -q -p trainer -p ps-server -p serving -p bench --bins
rm -rf "$OUT/run" "$OUT/export"
mkdir -p "$OUT/run"
grep -m1 'model name' /proc/cpuinfo | sed 's/.*: /machine: /'

gen() { [ -s "$OUT/$1.tsv" ] || "$BIN/gen-criteo" --rows "$2" --seed "$3" --teacher-seed 7 --out "$OUT/$1.tsv"; }
gen train "${TRAIN_ROWS:-200000}" 1
gen load "${LOAD_ROWS:-1000000}" 3
gen test "${TEST_ROWS:-50000}" 2

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# Starts ps-server I of 2 (the first generates the development certificates both use); sets ADDR. Not called
# in a command substitution: that subshell's PIDS would not reach the cleanup.
start_server() {
  local i=$1
  local dir=$OUT/run/ps-$i
  mkdir -p "$dir"
  "$BIN/ps-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir "$dir/data" \
    --tls-dir "$OUT/run/tls" --dev-certs --shard-index "$i" --num-shards 2 --sync-interval-secs "$SYNC" \
    >"$dir/ready" 2>"$dir/log" &
  PIDS+=($!)
  for _ in $(seq 1 600); do grep -q ready "$dir/ready" 2>/dev/null && break; sleep 0.1; done
  ADDR=$(grep -o 'quic=[^ ]*' "$dir/ready" | cut -d= -f2)
}
start_server 0
A=$ADDR
start_server 1
B=$ADDR
PS="$A,$B"
TLS=$OUT/run/tls

echo "== job 1: train ${TRAIN_ROWS:-200000} rows, export"
"$BIN/trainer" train --ps "$PS" --tls-dir "$TLS" --train "$OUT/train.tsv" --test "$OUT/test.tsv" \
  --export-dir "$OUT/export" --summary-json "$OUT/job1.json" >"$OUT/job1.log" 2>&1
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('job 1: step %d, test AUC %.6f, logloss %.6f' % (s['step'], s['auc'], s['logloss']))" "$OUT/job1.json"

"$BIN/ps-serve" --export "$OUT/export" --listen 127.0.0.1:0 --enable-embedding-api --subscribe "$PS" --tls-dir "$TLS" \
  --data-dir "$OUT/run/serve" >"$OUT/serve.out" 2>"$OUT/serve.log" &
PIDS+=($!)
for _ in $(seq 1 600); do grep -q '^serving export' "$OUT/serve.out" 2>/dev/null && break; sleep 0.1; done
URL=$(grep -o 'http://[^ ]*' "$OUT/serve.out" | head -1)
for _ in $(seq 1 600); do curl -sf "$URL/readyz" >/dev/null && break; sleep 0.1; done

echo "== AUC of /v1/predict answers on the test rows (job 1's evaluation above)"
"$BIN/serve-bench" --url "$URL" --data "$OUT/test.tsv" --auc --rows-per-request 256 --concurrency 4

echo "== predict latency and throughput (no training running)"
for spec in "1 16" "256 8"; do
  set -- $spec
  "$BIN/serve-bench" --url "$URL" --data "$OUT/test.tsv" --rows-per-request "$1" --concurrency "$2" \
    --duration "$SECS" --warmup 2
done

echo "== freshness under training load (job 2 trains on ${LOAD_ROWS:-1000000} other rows; sync interval ${SYNC} s)"
"$BIN/trainer" train --ps "$PS" --tls-dir "$TLS" --train "$OUT/load.tsv" --epochs 8 --publish-dense-every 50 \
  --summary-json "$OUT/job2.json" >"$OUT/job2.log" 2>&1 &
JOB2=$!
sleep 5
"$BIN/freshness-probe" --ps "$PS" --tls-dir "$TLS" --serve "$URL" --probes "${PROBES:-60}" \
  --max-gap-ms "$(python3 -c "print(int(${SYNC} * 1000))")"
echo "== predict latency under training load, 1 row per request"
"$BIN/serve-bench" --url "$URL" --data "$OUT/test.tsv" --rows-per-request 1 --concurrency 16 --duration "$SECS" --warmup 1
kill -TERM "$JOB2" 2>/dev/null || true
wait "$JOB2" 2>/dev/null || true
curl -s "$URL/v1/model"; echo
curl -s "$URL/metrics" | grep -E '^serving_delta_freshness_seconds_(sum|count)|^serving_model_age_seconds|^serving_deltas_applied_total'
