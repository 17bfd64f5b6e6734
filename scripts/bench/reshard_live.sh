#!/usr/bin/env bash
# Live resharding figure (issue 22): two trainers (ranks 0 and 1 of 2) and the ps-audit auditor train through
# two ps-server shards on loopback; mid-training the cluster grows to three servers (`ps-server reshard`
# onto a third server started with --standby), and once that is done and training goes on, shrinks back to
# two (the third server is then stopped). The same job runs first without resharding.
#
# Prints, last, one line:
#
#   reshards=2 lost_acked_updates=N max_pause_s=X duplicates=N grow_rows_per_s=X shrink_rows_per_s=X
#   grow_commit_s=X shrink_commit_s=X auc=X undisturbed_auc=Y
#
# (one line) where max_pause_s is the audit's longest gap between two acknowledged pushes of one shard over
# the resharded run, *_rows_per_s are the rows each reshard moved over its whole duration (`ps-server
# reshard`'s report), *_commit_s the time its commits took (the window in which moving rows are refused),
# and auc is rank 0's test AUC, undisturbed_auc the same from the run without resharding (same data, seeds
# and flags). A reshard that
# would not happen mid-training (a trainer already finished) fails the script.
#
# Installs nothing; builds the release binaries if missing, in $CARGO_TARGET_DIR/release if set, else
# target/release. Everything lives in a temporary directory; every process it started is killed on exit.
#
# Usage: scripts/bench/reshard_live.sh [--seed S] [--rows R] [--test-rows R] [--batch-size B]
#        [--durability D] [--settle-secs S] [--keep]
# --settle-secs: training time before the grow, and between the grow and the shrink (default 4).
set -euo pipefail

SEED=1
ROWS=400000
TEST_ROWS=50000
BATCH=1024
DURABILITY=periodic
SETTLE=4
KEEP=0

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --seed) SEED=$2; shift 2 ;;
        --rows) ROWS=$2; shift 2 ;;
        --test-rows) TEST_ROWS=$2; shift 2 ;;
        --batch-size) BATCH=$2; shift 2 ;;
        --durability) DURABILITY=$2; shift 2 ;;
        --settle-secs) SETTLE=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) usage ;;
        *) echo "reshard_live: unknown argument $1" >&2; usage ;;
    esac
done

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-target}
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
B="$TARGET_DIR/release"
need=()
for bin in ps-server trainer ps-audit gen-criteo; do [ -x "$B/$bin" ] || need+=("$bin"); done
if [ ${#need[@]} -gt 0 ]; then
    echo "reshard_live: building release binaries (missing: ${need[*]})" >&2
    (cd "$ROOT" && cargo build --release -p ps-server -p trainer -p bench --bins) >&2
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/reshard.XXXXXX")
declare -A PID=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for name in "${!PID[@]}"; do kill -KILL "${PID[$name]}" 2>/dev/null || true; done
    for name in "${!PID[@]}"; do wait "${PID[$name]}" 2>/dev/null || true; done
    if [ "$KEEP" = 1 ] || [ $rc -ne 0 ]; then echo "reshard_live: files kept in $TMP" >&2; else rm -rf "$TMP"; fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ms() { date +%s%3N; }
T0=$(now_ms)
log() { echo "reshard_live [$(( ($(now_ms) - T0) / 1000 ))s] $*" >&2; }

"$B/gen-criteo" --rows "$ROWS" --seed "$SEED" --teacher-seed 7 --out "$TMP/train.tsv" >/dev/null
"$B/gen-criteo" --rows "$TEST_ROWS" --seed $((SEED + 1000)) --teacher-seed 7 --out "$TMP/test.tsv" >/dev/null

# start_server DIR I N [FLAGS...]: server I of N, waits for its ready line; sets ADDR.
start_server() {
    local dir=$1 i=$2 n=$3 waited=0
    shift 3
    : > "$dir/ps-$i.ready"
    "$B/ps-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir "$dir/ps-$i" \
        --tls-dir "$dir/tls" --shard-index "$i" --num-shards "$n" --durability "$DURABILITY" "$@" \
        < /dev/null > "$dir/ps-$i.ready" 2>> "$dir/ps-$i.log" &
    PID[ps$i]=$!
    until grep -q 'quic=' "$dir/ps-$i.ready"; do
        sleep 0.05; waited=$((waited + 1))
        if [ $waited -gt 1200 ] || ! kill -0 "${PID[ps$i]}" 2>/dev/null; then
            echo "reshard_live: ps-server $i did not start; see $dir/ps-$i.log" >&2; tail -5 "$dir/ps-$i.log" >&2; exit 1
        fi
    done
    ADDR=$(grep -o 'quic=[^ ]*' "$dir/ps-$i.ready" | cut -d= -f2)
}

reap() { RC=0; wait "${PID[$1]}" 2>/dev/null || RC=$?; unset "PID[$1]"; }

running() { kill -0 "${PID[trainer0]}" 2>/dev/null && kill -0 "${PID[trainer1]}" 2>/dev/null; }

# reshard FROM TO NAME: runs ps-server reshard; fails unless both trainers were running before and after.
reshard() {
    local from=$1 to=$2 name=$3
    running || { echo "reshard_live: a trainer finished before the $name: use more --rows" >&2; exit 1; }
    "$B/ps-server" reshard --ps "$from" --to "$to" --tls-dir "$DIR/tls" > "$DIR/$name.out" 2> "$DIR/$name.log" \
        || { echo "reshard_live: $name failed:" >&2; cat "$DIR/$name.out" "$DIR/$name.log" >&2; exit 1; }
    running || { echo "reshard_live: a trainer finished during the $name: use more --rows" >&2; exit 1; }
    log "$(tail -1 "$DIR/$name.out")"
}

# run_job NAME RESHARD(0|1): sets LOST, DUPS, PAUSE, AUC.
run_job() {
    local name=$1 resharding=$2
    DIR="$TMP/$name"
    mkdir -p "$DIR"
    "$B/ps-server" certs init --tls-dir "$DIR/tls" >/dev/null 2>&1
    start_server "$DIR" 0 2; local a=$ADDR
    start_server "$DIR" 1 2; local b=$ADDR
    local two="$a,$b" three=""
    if [ "$resharding" = 1 ]; then
        start_server "$DIR" 2 3 --standby; three="$two,$ADDR"
    fi
    "$B/ps-audit" run --ps "$two" --tls-dir "$DIR/tls" --log "$DIR/acks.log" --seed "$SEED" >> "$DIR/audit.out" 2>&1 &
    PID[audit]=$!
    local r test
    for r in 0 1; do
        test=(); [ "$r" = 0 ] && test=(--test "$TMP/test.tsv")
        "$B/trainer" train --ps "$two" --tls-dir "$DIR/tls" --train "$TMP/train.tsv" "${test[@]}" \
            --rank "$r" --world 2 --seed "$SEED" --batch-size "$BATCH" --progress-secs 2 \
            --summary-json "$DIR/summary-$r.json" >> "$DIR/trainer-$r.out" 2>> "$DIR/trainer-$r.log" &
        PID[trainer$r]=$!
    done
    log "$name: servers $two, trainers and auditor started"
    if [ "$resharding" = 1 ]; then
        sleep "$SETTLE"
        reshard "$two" "$three" grow
        sleep "$SETTLE"
        reshard "$three" "$two" shrink
        # The leaving server is stopped at once (as an operator would); it drains while training goes on.
        kill -TERM "${PID[ps2]}"
    fi
    for r in 0 1; do
        reap "trainer$r"
        [ "$RC" = 0 ] || { echo "reshard_live: $name: trainer $r failed (exit $RC):" >&2; tail -20 "$DIR/trainer-$r.log" >&2; exit 1; }
    done
    log "$name: training done in $(python3 -c 'import json, sys; print(round(json.load(open(sys.argv[1]))["seconds"], 1))' "$DIR/summary-0.json") s (rank 0's summary)"
    kill -TERM "${PID[audit]}"; reap audit
    local verdict
    verdict=$("$B/ps-audit" verify --ps "$two" --tls-dir "$DIR/tls" --log "$DIR/acks.log" | tail -1)
    log "$name: $verdict"
    LOST=$(sed -n 's/.*lost_acked_updates=\([0-9]*\).*/\1/p' <<< "$verdict")
    DUPS=$(sed -n 's/.*duplicates=\([0-9]*\).*/\1/p' <<< "$verdict")
    PAUSE=$(sed -n 's/.*max_pause_s=\([0-9.]*\).*/\1/p' <<< "$verdict")
    AUC=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["auc"] or "")' "$DIR/summary-0.json")
    [ -n "$LOST" ] && [ -n "$PAUSE" ] && [ -n "$AUC" ] || { echo "reshard_live: $name: no audit verdict or AUC" >&2; exit 1; }
    kill -TERM "${PID[ps0]}" "${PID[ps1]}"; reap ps0; reap ps1
    [ "$resharding" = 0 ] || reap ps2
}

field() { sed -n "s/.* $2=\([0-9.]*\).*/\1/p" "$TMP/resharded/$1.out" | tail -1; }

run_job undisturbed 0
UNDISTURBED_AUC=$AUC
run_job resharded 1
printf 'reshards=2 lost_acked_updates=%d max_pause_s=%s duplicates=%d grow_rows_per_s=%s shrink_rows_per_s=%s grow_commit_s=%s shrink_commit_s=%s auc=%.4f undisturbed_auc=%.4f\n' \
    "$LOST" "$PAUSE" "$DUPS" "$(field grow rows_per_s)" "$(field shrink rows_per_s)" \
    "$(field grow commit_s)" "$(field shrink commit_s)" "$AUC" "$UNDISTURBED_AUC"
