#!/usr/bin/env bash
# Copy throughput of a live reshard on a populated cluster (issue 22): two ps-server shards on loopback get
# TABLES x ROWS rows (ps-bench --populate-rows), then, while ps-bench keeps pulling and pushing through them,
# `ps-server reshard` grows the cluster to three servers (a third started with --standby) and shrinks it back.
# Prints each reshard's summary line, ps-bench's throughput line, and last:
#
#   rows=N grow_rows_per_s=X shrink_rows_per_s=X grow_commit_s=X shrink_commit_s=X
#
# Usage: scripts/bench/reshard_copy.sh [--rows-per-table N] [--tables T] [--dim D] [--keep]
# Builds the release binaries if missing ($CARGO_TARGET_DIR/release or target/release); everything lives in
# a temporary directory; every process it started is killed on exit.
set -euo pipefail

ROWS=200000
TABLES=10
DIM=16
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
        --rows-per-table) ROWS=$2; shift 2 ;;
        --tables) TABLES=$2; shift 2 ;;
        --dim) DIM=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
        *) echo "reshard_copy: unknown argument $1" >&2; exit 2 ;;
    esac
done

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-target}
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
B="$TARGET_DIR/release"
for bin in ps-server ps-bench; do
    [ -x "$B/$bin" ] || (cd "$ROOT" && cargo build --release -p ps-server -p bench --bins) >&2
done

TMP=$(mktemp -d "${TMPDIR:-/tmp}/reshard-copy.XXXXXX")
PIDS=()
cleanup() {
    local rc=$?
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ "$KEEP" = 1 ] || [ $rc -ne 0 ]; then echo "reshard_copy: files kept in $TMP" >&2; else rm -rf "$TMP"; fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$B/ps-server" certs init --tls-dir "$TMP/tls" >/dev/null
# start I N [FLAGS...]: sets ADDR.
start() {
    local i=$1 n=$2 waited=0
    shift 2
    "$B/ps-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir "$TMP/ps-$i" --tls-dir "$TMP/tls" \
        --shard-index "$i" --num-shards "$n" "$@" < /dev/null > "$TMP/ps-$i.ready" 2>> "$TMP/ps-$i.log" &
    PIDS+=($!)
    until grep -q 'quic=' "$TMP/ps-$i.ready"; do
        sleep 0.05; waited=$((waited + 1))
        [ $waited -lt 1200 ] || { echo "reshard_copy: ps-server $i did not start" >&2; exit 1; }
    done
    ADDR=$(grep -o 'quic=[^ ]*' "$TMP/ps-$i.ready" | cut -d= -f2)
}
start 0 2; A=$ADDR
start 1 2; BB=$ADDR
start 2 3 --standby; C=$ADDR
TWO="$A,$BB"; THREE="$TWO,$C"

echo "reshard_copy: populating $TABLES tables x $ROWS rows (dim $DIM)" >&2
"$B/ps-bench" --ps "$TWO" --tls-dir "$TMP/tls" --tables "$TABLES" --dim "$DIM" --vocab "$ROWS" \
    --populate --populate-rows "$ROWS" --seconds 1 --warmup-seconds 0 --quiet > /dev/null
# Load through the whole reshard: pulls and pushes of the populated ids.
"$B/ps-bench" --ps "$TWO" --tls-dir "$TMP/tls" --tables "$TABLES" --dim "$DIM" --vocab "$ROWS" \
    --seconds 30 --warmup-seconds 0 > "$TMP/load.out" 2>&1 &
LOAD=$!
PIDS+=($LOAD)
sleep 2
"$B/ps-server" reshard --ps "$TWO" --to "$THREE" --tls-dir "$TMP/tls" | tee "$TMP/grow.out" | tail -1
sleep 2
"$B/ps-server" reshard --ps "$THREE" --to "$TWO" --tls-dir "$TMP/tls" | tee "$TMP/shrink.out" | tail -1
wait "$LOAD" || { echo "reshard_copy: the load failed:" >&2; tail -5 "$TMP/load.out" >&2; exit 1; }
tail -2 "$TMP/load.out"
field() { sed -n "s/.* $2=\([0-9.]*\).*/\1/p" "$TMP/$1.out" | tail -1; }
printf 'rows=%d grow_rows_per_s=%s shrink_rows_per_s=%s grow_commit_s=%s shrink_commit_s=%s\n' \
    "$((TABLES * ROWS))" "$(field grow rows_per_s)" "$(field shrink rows_per_s)" \
    "$(field grow commit_s)" "$(field shrink commit_s)"
