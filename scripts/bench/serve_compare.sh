#!/usr/bin/env bash
# ps-serve latency of two builds, interleaved (issue 40: "ps-serve p99 at 1 and 256 rows per request with
# limits on vs today"). Each build trains a small model through two of its own ps-servers and exports it; then,
# ROUNDS times, each build's ps-serve (default settings: the new build's limits on) serves its export alone
# while this build's serve-bench measures 1 row per request (16 clients) and 256 rows per request (4 clients),
# the builds alternating which goes first. Prints one line per measurement and the medians.
#
# Usage: scripts/bench/serve_compare.sh OLD_BIN_DIR NEW_BIN_DIR [OUT_DIR]
#   env: ROUNDS (3), SECS (8), TRAIN_ROWS (100000), TEST_ROWS (20000); serve-bench and gen-criteo come from
#        NEW_BIN_DIR.
set -euo pipefail
OLD=$1
NEW=$2
OUT=${3:-/var/tmp/serve-compare}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-8}
mkdir -p "$OUT"
grep -m1 'model name' /proc/cpuinfo | sed 's/.*: /machine: /'
[ -s "$OUT/train.tsv" ] || "$NEW/gen-criteo" --rows "${TRAIN_ROWS:-100000}" --seed 1 --teacher-seed 7 --out "$OUT/train.tsv" >/dev/null
[ -s "$OUT/test.tsv" ] || "$NEW/gen-criteo" --rows "${TEST_ROWS:-20000}" --seed 2 --teacher-seed 7 --out "$OUT/test.tsv" >/dev/null

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# wait_line FILE PATTERN: until FILE has a line matching PATTERN (a process's ready line).
wait_line() {
    for _ in $(seq 1 1200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "serve_compare: no '$2' in $1" >&2; exit 1
}

# export NAME BIN: two ps-servers of BIN, one training job with an export into $OUT/NAME/export.
export_model() {
    local name=$1 bin=$2 dir="$OUT/$1" ps=() i
    rm -rf "$dir"; mkdir -p "$dir"
    "$bin/ps-server" certs init --tls-dir "$dir/tls" >/dev/null
    for i in 0 1; do
        "$bin/ps-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir "$dir/ps$i" \
            --tls-dir "$dir/tls" --shard-index "$i" --num-shards 2 --checkpoint-root "$dir" \
            >"$dir/ps$i.out" 2>"$dir/ps$i.log" &
        PIDS+=($!)
        wait_line "$dir/ps$i.out" 'quic='
        ps+=("$(grep -o 'quic=[^ ]*' "$dir/ps$i.out" | cut -d= -f2)")
    done
    "$bin/trainer" train --ps "$(IFS=,; echo "${ps[*]}")" --tls-dir "$dir/tls" --train "$OUT/train.tsv" \
        --export-dir "$dir/export" >"$dir/train.log" 2>&1
    cleanup; PIDS=()
}

# measure NAME BIN ROWS CLIENTS: one serve-bench run against BIN's ps-serve on NAME's export; prints
# "NAME rows=R clients=C p50_ms=.. p99_ms=.. requests_per_s=..".
measure() {
    local name=$1 bin=$2 rows=$3 clients=$4 dir="$OUT/$1"
    : >"$dir/serve.out"
    "$bin/ps-serve" --export "$dir/export" --listen 127.0.0.1:0 >"$dir/serve.out" 2>"$dir/serve.log" &
    local pid=$!
    wait_line "$dir/serve.out" 'listening on http://'
    local url
    url=$(grep -o 'http://[^ ]*' "$dir/serve.out" | head -1)
    for _ in $(seq 1 600); do curl -sf "$url/readyz" >/dev/null && break; sleep 0.1; done
    local line
    line=$("$NEW/serve-bench" --url "$url" --data "$OUT/test.tsv" --rows-per-request "$rows" \
        --concurrency "$clients" --duration "$SECS" --warmup 1 2>&1 | tail -1)
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    echo "$name rows=$rows clients=$clients $line"
}

export_model old "$OLD"
export_model new "$NEW"
for r in $(seq 1 "$ROUNDS"); do
    order=(old new); [ $((r % 2)) = 0 ] && order=(new old)
    for b in "${order[@]}"; do
        bin=$OLD; [ "$b" = new ] && bin=$NEW
        measure "$b" "$bin" 1 16
        measure "$b" "$bin" 256 4
    done
done | tee "$OUT/results.txt"
