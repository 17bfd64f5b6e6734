#!/usr/bin/env bash
# Issue 43's quantized-serving figures in one run, on loopback: two ps-servers, `trainer train` on TRAIN_ROWS
# rows with an export (the default model: dim 16; TRAIN_ARGS adds trainer flags); then ps-serve on that
# export with its rows as stored (the engine store: RocksDB copy + optimizer state) and with `--row-precision f32|bf16|int8`, ROUNDS rounds in rotating
# order. For each: rows and estimated bytes of rows in memory (serving_rows_memory_bytes), the AUC of the
# answers on the test rows (`serve-bench --auc`) against the trainer's, and /v1/predict latency at 256 rows
# per request (serve-bench, 8 clients, SECONDS_EACH s). Everything shares the machine's cores.
# Usage: scripts/bench/serve_precision.sh [OUT_DIR]
#   env: TRAIN_ROWS (300000), TEST_ROWS (50000), TRAIN_ARGS (''), ROUNDS (2), SECONDS_EACH (10),
#        BIN_DIR (default $CARGO_TARGET_DIR/release or target/release), SKIP_BUILD=1
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/var/tmp/serve-precision}
BIN=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
SECS=${SECONDS_EACH:-10}
[ -n "${SKIP_BUILD:-}" ] || cargo build --release -q -p trainer -p ps-server -p serving -p bench --bins
rm -rf "$OUT/run" "$OUT/export"
mkdir -p "$OUT/run"
grep -m1 'model name' /proc/cpuinfo | sed 's/.*: /machine: /'

gen() { [ -s "$OUT/$1.tsv" ] || "$BIN/gen-criteo" --rows "$2" --seed "$3" --teacher-seed 7 --out "$OUT/$1.tsv"; }
gen train "${TRAIN_ROWS:-300000}" 1
gen test "${TEST_ROWS:-50000}" 2

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

start_server() {
  local i=$1
  local dir=$OUT/run/ps-$i
  mkdir -p "$dir"
  "$BIN/ps-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir "$dir/data" \
    --tls-dir "$OUT/run/tls" --dev-certs --shard-index "$i" --num-shards 2 --checkpoint-root "$OUT" \
    >"$dir/ready" 2>"$dir/log" &
  PIDS+=($!)
  for _ in $(seq 1 600); do grep -q ready "$dir/ready" 2>/dev/null && break; sleep 0.1; done
  ADDR=$(grep -o 'quic=[^ ]*' "$dir/ready" | cut -d= -f2)
}
start_server 0
A=$ADDR
start_server 1
PS="$A,$ADDR"

echo "== train ${TRAIN_ROWS:-300000} rows, export ${TRAIN_ARGS:-}"
# shellcheck disable=SC2086
"$BIN/trainer" train --ps "$PS" --tls-dir "$OUT/run/tls" --train "$OUT/train.tsv" --test "$OUT/test.tsv" \
  ${TRAIN_ARGS:-} --export-dir "$OUT/export" --summary-json "$OUT/train.json" >"$OUT/train.log" 2>&1
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('trainer: test AUC %.6f' % s['auc'])" "$OUT/train.json"

# One ps-serve with flags "$@": prints rows, bytes, AUC and latency as one line of JSON.
serve_once() {
  local name=$1; shift
  local out=$OUT/run/serve-$name
  rm -rf "$out"; mkdir -p "$out"
  "$BIN/ps-serve" --export "$OUT/export" --listen 127.0.0.1:0 --data-dir "$out/data" "$@" \
    >"$out/stdout" 2>"$out/log" &
  local pid=$!
  for _ in $(seq 1 600); do grep -q 'http://' "$out/stdout" 2>/dev/null && break; sleep 0.1; done
  local url
  url=$(grep -o 'http://[^ ]*' "$out/stdout" | head -1)
  for _ in $(seq 1 1200); do curl -sf "$url/readyz" >/dev/null && break; sleep 0.1; done
  curl -s "$url/metrics" >"$out/metrics"
  "$BIN/serve-bench" --url "$url" --data "$OUT/test.tsv" --auc --rows-per-request 256 --concurrency 4 \
    --json "$out/auc.json" >/dev/null
  "$BIN/serve-bench" --url "$url" --data "$OUT/test.tsv" --rows-per-request 256 --concurrency 8 \
    --duration "$SECS" --warmup 2 --json "$out/load.json" >/dev/null
  kill -TERM "$pid"; wait "$pid" || true
  python3 - "$name" "$out" "$OUT/train.json" <<'PY'
import json, sys
name, out, train = sys.argv[1:]
m = {}
for line in open(f"{out}/metrics"):
    if line.startswith("serving_rows_"):
        k, v = line.split()
        m[k] = float(v)
auc = json.load(open(f"{out}/auc.json"))
load = json.load(open(f"{out}/load.json"))
want = json.load(open(train))["auc"]
rows, b = m["serving_rows_in_memory"], m["serving_rows_memory_bytes"]
print(json.dumps({"store": name, "rows": int(rows), "bytes_per_row": round(b / rows, 1),
                  "auc": round(auc["auc"], 6), "auc_minus_trainer": round(auc["auc"] - want, 6),
                  "rows_per_sec": round(load["rows_per_sec"]), "p50_ms": round(load["p50_ms"], 2),
                  "p99_ms": round(load["p99_ms"], 2)}))
PY
}

ORDER=(engine f32 bf16 int8)
for r in $(seq 1 "${ROUNDS:-2}"); do
  echo "== round $r"
  for k in "${!ORDER[@]}"; do
    name=${ORDER[$(( (k + r - 1) % 4 ))]}
    if [ "$name" = engine ]; then serve_once engine; else serve_once "$name" --row-precision "$name"; fi
  done
done | tee "$OUT/results.txt"
