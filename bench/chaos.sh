#!/usr/bin/env bash
# Chaos run (issue 7): two ps-servers, two trainers (ranks 0 and 1 of 2, disjoint halves of the data) and the
# ps-audit auditor on loopback. SIGKILLs a random process (a server, a trainer or the auditor; seeded) N times
# at random intervals and restarts it: a server on its port and data directory, a trainer with --resume from
# its last checkpoint if it has written one (else from the start of its share), the auditor on its log. Then
# checks the audit (acknowledged pushes against the servers' counters) and prints, last, one line:
#
#   faults=N lost_acked_updates=N auc=X undisturbed_auc=Y
#
# where undisturbed_auc comes from the same job (same data, seeds and flags) run first without kills. Installs
# nothing; builds the release binaries if missing. Everything lives in a temporary directory; every process it
# started is killed on exit or interrupt.
#
# Usage: bench/chaos.sh --kills N --durability sync|periodic [--seed S] [--rows R] [--test-rows R]
#        [--flush-interval-secs I] [--batch-size B] [--checkpoint-every K] [--keep]
# --checkpoint-every 0: no checkpoints; a killed trainer restarts from the start of its share.
set -euo pipefail

KILLS=5
DURABILITY=sync
SEED=1
ROWS=200000
TEST_ROWS=50000
FLUSH=2
BATCH=1024
CKPT_EVERY=8
KEEP=0
# Interval between faults: MIN_GAP_MS + uniform [0, GAP_SPAN_MS).
MIN_GAP_MS=1500
GAP_SPAN_MS=2500

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --kills) KILLS=$2; shift 2 ;;
        --durability) DURABILITY=$2; shift 2 ;;
        --seed) SEED=$2; shift 2 ;;
        --rows) ROWS=$2; shift 2 ;;
        --test-rows) TEST_ROWS=$2; shift 2 ;;
        --flush-interval-secs) FLUSH=$2; shift 2 ;;
        --batch-size) BATCH=$2; shift 2 ;;
        --checkpoint-every) CKPT_EVERY=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) usage ;;
        *) echo "chaos: unknown argument $1" >&2; usage ;;
    esac
done
case "$DURABILITY" in sync|periodic|none) ;; *) echo "chaos: --durability $DURABILITY: expected sync or periodic" >&2; exit 2 ;; esac
[[ "$KILLS" =~ ^[0-9]+$ ]] || { echo "chaos: --kills $KILLS: expected a count" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
B="$ROOT/target/release"
need=()
for bin in ps-server trainer ps-audit gen-criteo; do [ -x "$B/$bin" ] || need+=("$bin"); done
if [ ${#need[@]} -gt 0 ]; then
    echo "chaos: building release binaries (missing: ${need[*]})" >&2
    (cd "$ROOT" && cargo build --release -p ps-server -p trainer -p bench --bins) >&2
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/chaos.XXXXXX")
declare -A PID=()    # process name -> pid of every process this script started and has not reaped

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for name in "${!PID[@]}"; do
        kill -KILL "${PID[$name]}" 2>/dev/null || true
    done
    for name in "${!PID[@]}"; do
        wait "${PID[$name]}" 2>/dev/null || true
    done
    if [ "$KEEP" = 1 ] || [ $rc -ne 0 ]; then
        echo "chaos: files kept in $TMP" >&2
    else
        rm -rf "$TMP"
    fi
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now_ms() { date +%s%3N; }
log() { echo "chaos [$(( ($(now_ms) - T0) / 1000 ))s] $*" >&2; }
T0=$(now_ms)

# Data: one training file (the two ranks read disjoint halves: line index % 2) and one test file.
"$B/gen-criteo" --rows "$ROWS" --seed "$SEED" --teacher-seed 7 --out "$TMP/train.tsv" >/dev/null
"$B/gen-criteo" --rows "$TEST_ROWS" --seed $((SEED + 1000)) --teacher-seed 7 --out "$TMP/test.tsv" >/dev/null

# start_server DIR I PORT: starts server I on PORT (0 = a free one) and sets PORT_$I once it is ready.
start_server() {
    local dir=$1 i=$2 port=$3
    : > "$dir/ps-$i.ready"
    "$B/ps-server" --listen "127.0.0.1:$port" --metrics-listen 127.0.0.1:0 --data-dir "$dir/ps-$i" \
        --tls-dir "$dir/tls" --shard-index "$i" --num-shards 2 --durability "$DURABILITY" \
        --flush-interval-secs "$FLUSH" > "$dir/ps-$i.ready" 2>> "$dir/ps-$i.log" &
    PID[ps$i]=$!
    local waited=0
    until grep -q 'quic=' "$dir/ps-$i.ready"; do
        sleep 0.05; waited=$((waited + 1))
        if [ $waited -gt 1200 ] || ! kill -0 "${PID[ps$i]}" 2>/dev/null; then
            echo "chaos: ps-server $i did not start; see $dir/ps-$i.log" >&2; tail -5 "$dir/ps-$i.log" >&2; exit 1
        fi
    done
    local addr
    addr=$(grep -o 'quic=[^ ]*' "$dir/ps-$i.ready" | cut -d= -f2)
    printf -v "PORT_$i" '%s' "${addr##*:}"
}

start_auditor() {
    local dir=$1
    "$B/ps-audit" run --ps "$PS" --tls-dir "$dir/tls" --log "$dir/acks.log" --seed "$SEED" \
        >> "$dir/audit.out" 2>&1 &
    PID[audit]=$!
}

# start_trainer DIR RANK: resumes from the rank's last checkpoint if there is one.
start_trainer() {
    local dir=$1 r=$2 resume=() test=() ckpt=()
    [ "$CKPT_EVERY" -gt 0 ] && ckpt=(--checkpoint-dir "$dir/ckpt" --checkpoint-every "$CKPT_EVERY")
    if [ "$CKPT_EVERY" -gt 0 ] && [ -f "$dir/ckpt/trainer-rank$r.ckpt" ]; then
        resume=(--resume "$dir/ckpt")
        log "trainer $r resumes from its checkpoint"
    fi
    [ "$r" = 0 ] && test=(--test "$TMP/test.tsv")
    "$B/trainer" train --ps "$PS" --tls-dir "$dir/tls" --train "$TMP/train.tsv" "${test[@]}" \
        --rank "$r" --world 2 --seed "$SEED" --batch-size "$BATCH" --progress-secs 5 \
        "${ckpt[@]}" "${resume[@]}" \
        --summary-json "$dir/summary-$r.json" >> "$dir/trainer-$r.out" 2>> "$dir/trainer-$r.log" &
    PID[trainer$r]=$!
}

restart() {
    local dir=$1 name=$2
    case "$name" in
        ps0) start_server "$dir" 0 "$PORT_0" ;;
        ps1) start_server "$dir" 1 "$PORT_1" ;;
        audit) start_auditor "$dir" ;;
        trainer0) start_trainer "$dir" 0 ;;
        trainer1) start_trainer "$dir" 1 ;;
    esac
}

# reap NAME: waits for a process of this script and forgets it; sets RC to its exit status (not in a
# subshell: only this shell can wait for its children).
reap() {
    RC=0
    wait "${PID[$1]}" 2>/dev/null || RC=$?
    unset "PID[$1]"
}

# run_job NAME KILLS: one whole job; sets FAULTS, LOST, DUPS, AUC.
run_job() {
    local name=$1 kills=$2 dir="$TMP/$1"
    mkdir -p "$dir/ckpt"
    "$B/ps-server" certs init --tls-dir "$dir/tls" >/dev/null 2>&1
    start_server "$dir" 0 0
    start_server "$dir" 1 0
    PS="127.0.0.1:$PORT_0,127.0.0.1:$PORT_1"
    start_auditor "$dir"
    start_trainer "$dir" 0
    start_trainer "$dir" 1
    log "$name: servers $PS, durability $DURABILITY, $kills faults to inject"
    local started
    started=$(now_ms)

    RANDOM=$SEED
    FAULTS=0
    local done0=0 done1=0
    finished() {  # trainer R exited on its own: check its status
        local r=$1
        reap "trainer$r"
        if [ "$RC" != 0 ]; then
            echo "chaos: $name: trainer $r failed (exit $RC):" >&2; tail -20 "$dir/trainer-$r.log" >&2; exit 1
        fi
        log "$name: trainer $r finished"
    }
    while [ "$FAULTS" -lt "$kills" ]; do
        local gap=$((MIN_GAP_MS + RANDOM % GAP_SPAN_MS))
        sleep "$((gap / 1000)).$(printf %03d $((gap % 1000)))"
        local victims=(ps0 ps1 audit)
        for r in 0 1; do
            local d="done$r"
            if [ "${!d}" = 0 ]; then
                if kill -0 "${PID[trainer$r]}" 2>/dev/null; then victims+=("trainer$r"); else finished "$r"; printf -v "done$r" 1; fi
            fi
        done
        local victim=${victims[$((RANDOM % ${#victims[@]}))]}
        kill -KILL "${PID[$victim]}" 2>/dev/null || true
        reap "$victim"
        FAULTS=$((FAULTS + 1))
        log "$name: fault $FAULTS: SIGKILL $victim, restarting it"
        sleep 0.3
        restart "$dir" "$victim"
    done
    for r in 0 1; do
        local d="done$r"
        [ "${!d}" = 1 ] || finished "$r"
    done
    log "$name: training done in $(( ($(now_ms) - started) / 1000 )) s"

    kill -TERM "${PID[audit]}"
    reap audit
    local verdict
    verdict=$("$B/ps-audit" verify --ps "$PS" --tls-dir "$dir/tls" --log "$dir/acks.log" | tail -1)
    log "$name: $verdict"
    LOST=$(sed -n 's/.*lost_acked_updates=\([0-9]*\).*/\1/p' <<< "$verdict")
    DUPS=$(sed -n 's/.*duplicates=\([0-9]*\).*/\1/p' <<< "$verdict")
    AUC=$(tr -d ' \n' < "$dir/summary-0.json" | sed -n 's/.*"auc":\([0-9.]*\).*/\1/p')
    [ -n "$LOST" ] && [ -n "$AUC" ] || { echo "chaos: $name: no audit verdict or AUC" >&2; exit 1; }
    for i in 0 1; do kill -TERM "${PID[ps$i]}"; done
    for i in 0 1; do reap "ps$i"; done
}

run_job undisturbed 0
UNDISTURBED_AUC=$AUC
[ "$LOST" = 0 ] || log "WARNING: the undisturbed run lost $LOST acknowledged updates"
run_job chaos "$KILLS"
log "chaos run: $FAULTS faults, $DUPS duplicate increments (at-least-once retries, unlogged acks), flush interval ${FLUSH}s"
printf 'faults=%d lost_acked_updates=%d auc=%.4f undisturbed_auc=%.4f\n' "$FAULTS" "$LOST" "$AUC" "$UNDISTURBED_AUC"
