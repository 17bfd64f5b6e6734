#!/usr/bin/env bash
# Chaos run (issues 7 and 22): two parameter-server shards, two trainers (ranks 0 and 1 of 2, disjoint halves of
# the data) and the ps-audit auditor on loopback. Injects N faults at random intervals (seeded) and checks the
# audit (acknowledged pushes against the servers' counters) at the end.
#
# Trainers run `--dense-mode async` (dense parameters on the servers): a trainer killed and restarted alone
# rejoins the job, which the default hybrid mode does not allow (its steps wait for every rank: README.md).
#
# --replicas 1 (default): one ps-server per shard. Each fault SIGKILLs a random process (a server, a trainer
# or the auditor) and restarts it: a server on its port and data directory, a trainer with --resume from its
# last checkpoint if it has written one (else from the start of its share), the auditor on its log.
# --replicas R >= 2: R ps-servers per shard (docs/replication.md) on ports picked before the start, each with
# --replica-index r --replicas <its shard's R addresses>; trainers and the auditor get --ps a0/a1,b0/b1. Each
# fault SIGKILLs the current primary of a random shard (the replica whose metrics endpoint, from the
# `metrics=` of its ready line, reports `ps_replica_primary 1`) and restarts it on its port and data
# directory, where it rejoins as a backup. Trainers and the auditor are not killed.
#
# Prints, last, one line:
#
#   faults=N lost_acked_updates=N max_pause_s=X duplicates=N unacked_applied=N auc=X undisturbed_auc=Y
#
# where max_pause_s is the audit's longest gap between two acknowledged pushes of one shard (restarts of the
# auditor excluded), duplicates counts increments beyond every push the auditor sent (pushes applied twice),
# unacked_applied the pushes sent and never acknowledged that were applied (a reply lost, the auditor killed
# before logging it: ps-audit's log records each push before sending it), and undisturbed_auc comes from the same job (same data, seeds, flags and replicas) run
# first without faults; auc is rank 0's test AUC (its summary's top-level "auc"). Installs nothing (needs python3:
# picking ports, reading the summary); builds the release
# binaries if missing, in $CARGO_TARGET_DIR/release if set, else target/release. Everything lives in a
# temporary directory; every process it started is killed on exit or interrupt.
#
# --disk-faults (needs root: mount): every server's data directory is a 256 MiB tmpfs of its own, and a fault
# is, half the time, a full disk instead of a kill: the server's filesystem is filled to the last byte for
# DISK_FULL_SECS (default 3) seconds, then the filler is deleted. The server refuses pushes (Storage, its
# disk reserve set to 16 MiB here), clients retry, and the audit checks that nothing acknowledged was lost or
# applied twice.
#
# --partition-faults (needs root: ip netns): every server runs in a network namespace of its own, linked to the
# host's by a veth pair (10.213.<n>.2, the host end 10.213.<n>.1; the host forwards between them, so replicas
# reach each other through it), and a fault is, half the time (a third each with --disk-faults), a network
# partition instead of a kill: one server (with replicas, the current primary of a random shard) is cut off from
# everything (trainers, the auditor and its fellow replicas) for PARTITION_SECS (default 8) seconds, then healed. The cut is silent, as a real one is:
# each end's neighbour entry for the other points at a MAC address nobody has, so packets are dropped without
# an error to either side. The line of each fault in the log says what it was.
#
# Usage: scripts/bench/chaos.sh --kills N --durability sync|periodic|replicated [--replicas R] [--seed S] [--rows R]
#        [--test-rows R] [--flush-interval-secs I] [--batch-size B] [--checkpoint-every K] [--disk-faults]
#        [--partition-faults] [--keep]
# --checkpoint-every 0: no checkpoints; a killed trainer restarts from the start of its share.
# --durability replicated needs --replicas 2 or more.
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
REPLICAS=1
DISK_FAULTS=0
DISK_FULL_SECS=${DISK_FULL_SECS:-3}
PARTITION_FAULTS=0
PARTITION_SECS=${PARTITION_SECS:-8}
# Interval between faults: MIN_GAP_MS + uniform [0, GAP_SPAN_MS).
MIN_GAP_MS=1500
GAP_SPAN_MS=2500

usage() { sed -n '2,47p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --kills) KILLS=$2; shift 2 ;;
        --durability) DURABILITY=$2; shift 2 ;;
        --replicas) REPLICAS=$2; shift 2 ;;
        --seed) SEED=$2; shift 2 ;;
        --rows) ROWS=$2; shift 2 ;;
        --test-rows) TEST_ROWS=$2; shift 2 ;;
        --flush-interval-secs) FLUSH=$2; shift 2 ;;
        --batch-size) BATCH=$2; shift 2 ;;
        --checkpoint-every) CKPT_EVERY=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --disk-faults) DISK_FAULTS=1; shift ;;
        --partition-faults) PARTITION_FAULTS=1; shift ;;
        -h|--help) usage ;;
        *) echo "chaos: unknown argument $1" >&2; usage ;;
    esac
done
case "$DURABILITY" in
    sync|periodic|none|replicated) ;;
    *) echo "chaos: --durability $DURABILITY: expected sync, periodic or replicated" >&2; exit 2 ;;
esac
[[ "$KILLS" =~ ^[0-9]+$ ]] || { echo "chaos: --kills $KILLS: expected a count" >&2; exit 2; }
[[ "$REPLICAS" =~ ^[1-9][0-9]*$ ]] || { echo "chaos: --replicas $REPLICAS: expected 1 or more" >&2; exit 2; }
if [ "$DURABILITY" = replicated ] && [ "$REPLICAS" -lt 2 ]; then
    echo "chaos: --durability replicated needs --replicas 2 or more" >&2; exit 2
fi

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# cargo puts the binaries under CARGO_TARGET_DIR when set (relative to where it runs: $ROOT below).
TARGET_DIR=${CARGO_TARGET_DIR:-target}
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$ROOT/$TARGET_DIR" ;; esac
B="$TARGET_DIR/release"
need=()
for bin in ps-server trainer ps-audit gen-criteo; do [ -x "$B/$bin" ] || need+=("$bin"); done
if [ ${#need[@]} -gt 0 ]; then
    echo "chaos: building release binaries (missing: ${need[*]})" >&2
    (cd "$ROOT" && cargo build --release -p ps-server -p trainer -p bench --bins) >&2
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/chaos.XXXXXX")
declare -A PID=()    # process name -> pid of every process this script started and has not reaped
MOUNTS=()            # tmpfs mounts of --disk-faults, unmounted on exit
NETNS=()             # network namespaces of --partition-faults, deleted on exit
FORWARD_WAS=         # net.ipv4.ip_forward before --partition-faults set it, restored on exit

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for name in "${!PID[@]}"; do
        kill -KILL "${PID[$name]}" 2>/dev/null || true
    done
    for name in "${!PID[@]}"; do
        wait "${PID[$name]}" 2>/dev/null || true
    done
    for m in "${MOUNTS[@]}"; do umount -l "$m" 2>/dev/null || true; done
    for ns in "${NETNS[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
    [ -z "$FORWARD_WAS" ] || sysctl -qw net.ipv4.ip_forward="$FORWARD_WAS" || true
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

SHARDS=2
# The TLS name every process verifies: the only name on the servers' certificate (with *.ps).
TLS_NAME=ps
declare -A PORT=()     # server name -> its listen port (fixed after its first start)
declare -A METRICS=()  # server name -> its metrics address, from its last ready line

# Server names: ps0 ps1 with one replica per shard (files ps-0.*), else ps<shard>r<replica> (files
# ps-<shard>-r<replica>.*).
server_name() { if [ "$REPLICAS" = 1 ]; then echo "ps$1"; else echo "ps$1r$2"; fi; }
server_file() { if [ "$REPLICAS" = 1 ]; then echo "ps-$1"; else echo "ps-$1-r$2"; fi; }
all_servers() {
    local i r
    for i in $(seq 0 $((SHARDS - 1))); do
        for r in $(seq 0 $((REPLICAS - 1))); do echo "$i $r"; done
    done
}

# server_host NAME: the address server NAME listens on: loopback, or with --partition-faults its namespace's.
declare -A HOST=()
server_host() { echo "${HOST[$1]:-127.0.0.1}"; }

# netns_setup NAME N: with --partition-faults, network namespace chaos<pid>-NAME linked to the host by a veth
# pair (host end 10.213.N.1, namespace end 10.213.N.2, the namespace's default route through the host end);
# sets HOST[NAME]. Kept across restarts of the server and across both jobs.
netns_setup() {
    local name=$1 n=$2 ns="chaos$$-$1" host_if="chh$$n$2" ns_if="chn$$n$2"
    HOST[$name]=10.213.$n.2
    ip netns list | grep -qw "$ns" && return 0
    if [ -z "$FORWARD_WAS" ]; then
        FORWARD_WAS=$(sysctl -n net.ipv4.ip_forward)
        sysctl -qw net.ipv4.ip_forward=1
    fi
    ip netns add "$ns" || { echo "chaos: --partition-faults: cannot create a network namespace (needs root)" >&2; exit 1; }
    NETNS+=("$ns")
    ip link add "$host_if" type veth peer name "$ns_if"
    ip link set "$ns_if" netns "$ns"
    ip addr add "10.213.$n.1/30" dev "$host_if"
    ip link set "$host_if" up
    ip -n "$ns" addr add "10.213.$n.2/30" dev "$ns_if"
    ip -n "$ns" link set "$ns_if" up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default via "10.213.$n.1"
}

# partition NAME on|off: cuts server NAME off from everything, silently (each end's neighbour entry for the
# other points at an address nobody has), or heals the cut.
partition() {
    local name=$1 n ns="chaos$$-$1"
    n=${HOST[$name]#10.213.}; n=${n%.2}
    local host_if="chh$$n$n" ns_if="chn$$n$n"
    if [ "$2" = on ]; then
        ip neigh replace "10.213.$n.2" lladdr 02:00:00:00:de:ad dev "$host_if" nud permanent
        ip -n "$ns" neigh replace "10.213.$n.1" lladdr 02:00:00:00:be:ef dev "$ns_if" nud permanent
    else
        ip neigh del "10.213.$n.2" dev "$host_if" 2>/dev/null || true
        ip -n "$ns" neigh del "10.213.$n.1" dev "$ns_if" 2>/dev/null || true
    fi
}

# pick_ports N: N distinct loopback ports, each free for UDP (QUIC) and TCP when picked (held until all are
# picked, then released).
pick_ports() {
    python3 - "$1" <<'PY'
import socket, sys
held, ports = [], []
while len(ports) < int(sys.argv[1]):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("127.0.0.1", 0))
    port = u.getsockname()[1]
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", port))
    except OSError:
        u.close(); t.close(); continue
    held += [u, t]; ports.append(port)
print(" ".join(map(str, ports)))
PY
}

# launch_server DIR I R: starts replica R of shard I on PORT[name] (0 = a free one) without waiting.
launch_server() {
    local dir=$1 i=$2 r=$3 name file replica_flags=()
    name=$(server_name "$i" "$r")
    file=$(server_file "$i" "$r")
    if [ "$REPLICAS" -gt 1 ]; then
        local peers=() k
        for k in $(seq 0 $((REPLICAS - 1))); do
            local peer
            peer=$(server_name "$i" "$k")
            peers+=("$(server_host "$peer"):${PORT[$peer]}")
        done
        replica_flags=(--replica-index "$r" --replicas "$(IFS=,; echo "${peers[*]}")")
    fi
    : > "$dir/$file.ready"
    local disk_flags=()
    if [ "$DISK_FAULTS" = 1 ]; then
        if ! mountpoint -q "$dir/$file"; then
            mkdir -p "$dir/$file"
            mount -t tmpfs -o size=256m tmpfs "$dir/$file" \
                || { echo "chaos: --disk-faults: cannot mount a tmpfs on $dir/$file (needs root)" >&2; exit 1; }
            MOUNTS+=("$dir/$file")
        fi
        disk_flags=(--disk-reserve-mib 16)
    fi
    local in_ns=()
    [ "$PARTITION_FAULTS" = 1 ] && in_ns=(ip netns exec "chaos$$-$name")
    local host
    host=$(server_host "$name")
    "${in_ns[@]}" "$B/ps-server" "${disk_flags[@]}" --listen "$host:${PORT[$name]:-0}" --metrics-listen "$host:0" --data-dir "$dir/$file" \
        --tls-dir "$dir/tls" --shard-index "$i" --num-shards "$SHARDS" "${replica_flags[@]}" \
        --replica-server-name "$TLS_NAME" --checkpoint-root "$dir" \
        --durability "$DURABILITY" --flush-interval-secs "$FLUSH" < /dev/null > "$dir/$file.ready" 2>> "$dir/$file.log" &
    PID[$name]=$!
}

# await_server DIR I R: waits for the ready line of replica R of shard I; sets PORT[name] and METRICS[name].
await_server() {
    local dir=$1 i=$2 r=$3 name file waited=0
    name=$(server_name "$i" "$r")
    file=$(server_file "$i" "$r")
    until grep -q 'quic=' "$dir/$file.ready"; do
        sleep 0.05; waited=$((waited + 1))
        if [ $waited -gt 1200 ] || ! kill -0 "${PID[$name]}" 2>/dev/null; then
            echo "chaos: ps-server $name did not start; see $dir/$file.log" >&2; tail -5 "$dir/$file.log" >&2; exit 1
        fi
    done
    local addr
    addr=$(grep -o 'quic=[^ ]*' "$dir/$file.ready" | cut -d= -f2)
    PORT[$name]=${addr##*:}
    METRICS[$name]=$(grep -o 'metrics=[^ ]*' "$dir/$file.ready" | cut -d= -f2)
    ROLE=$(grep -o 'role=[^ ]*' "$dir/$file.ready" | cut -d= -f2 || true)
}

# start_servers DIR: every replica of every shard, all launched before any is awaited (replicas look for
# their peers while starting); with replicas, on ports picked first. Sets PS (the --ps argument).
start_servers() {
    local dir=$1 i r
    PORT=()
    if [ "$PARTITION_FAULTS" = 1 ]; then
        # Each server has a namespace, so a port, of its own.
        local n=0
        while read -r i r; do
            netns_setup "$(server_name "$i" "$r")" "$n"
            PORT[$(server_name "$i" "$r")]=7000
            n=$((n + 1))
        done < <(all_servers)
    elif [ "$REPLICAS" -gt 1 ]; then
        local ports
        read -r -a ports <<< "$(pick_ports $((SHARDS * REPLICAS)))"
        while read -r i r; do PORT[$(server_name "$i" "$r")]=${ports[$((i * REPLICAS + r))]}; done < <(all_servers)
    fi
    while read -r i r; do launch_server "$dir" "$i" "$r"; done < <(all_servers)
    while read -r i r; do await_server "$dir" "$i" "$r"; done < <(all_servers)
    local shards=() addrs
    for i in $(seq 0 $((SHARDS - 1))); do
        addrs=()
        for r in $(seq 0 $((REPLICAS - 1))); do
            local s
            s=$(server_name "$i" "$r")
            addrs+=("$(server_host "$s"):${PORT[$s]}")
        done
        shards+=("$(IFS=/; echo "${addrs[*]}")")
    done
    PS=$(IFS=,; echo "${shards[*]}")
}

# metric ADDR NAME: the value of the unlabelled sample NAME on the metrics endpoint ADDR (empty if it does
# not answer within 2 s or has no such sample). Plain bash: HTTP/1.0 over /dev/tcp.
metric() {
    local addr=$1 name=$2
    timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n" "$1" >&3 && cat <&3' \
        _ "${addr%:*}" "${addr##*:}" 2>/dev/null | tr -d '\r' | awk -v n="$name" '$1 == n { print $2; exit }'
}

# primaries: the names of the replicas that report ps_replica_primary 1 now, one per line.
primaries() {
    local i r name
    while read -r i r; do
        name=$(server_name "$i" "$r")
        [ "$(metric "${METRICS[$name]}" ps_replica_primary)" = 1 ] && echo "$name"
    done < <(all_servers)
    return 0
}

start_auditor() {
    local dir=$1
    "$B/ps-audit" run --ps "$PS" --tls-dir "$dir/tls" --server-name "$TLS_NAME" --log "$dir/acks.log" --seed "$SEED" \
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
    "$B/trainer" train --ps "$PS" --tls-dir "$dir/tls" --server-name "$TLS_NAME" --train "$TMP/train.tsv" "${test[@]}" \
        --rank "$r" --world 2 --seed "$SEED" --batch-size "$BATCH" --progress-secs 5 \
        --dense-mode async "${ckpt[@]}" "${resume[@]}" \
        --summary-json "$dir/summary-$r.json" >> "$dir/trainer-$r.out" 2>> "$dir/trainer-$r.log" &
    PID[trainer$r]=$!
}

restart() {
    local dir=$1 name=$2 i r
    case "$name" in
        audit) start_auditor "$dir" ;;
        trainer0) start_trainer "$dir" 0 ;;
        trainer1) start_trainer "$dir" 1 ;;
        ps*)  # ps<i> or ps<i>r<r>: on its port and data directory
            i=${name#ps}; i=${i%%r*}; r=0
            [[ "$name" == *r* ]] && r=${name##*r}
            launch_server "$dir" "$i" "$r"
            await_server "$dir" "$i" "$r"
            [ -z "$ROLE" ] || log "$name is back as $ROLE"
            ;;
    esac
}

# reap NAME: waits for a process of this script and forgets it; sets RC to its exit status (not in a
# subshell: only this shell can wait for its children).
reap() {
    RC=0
    wait "${PID[$1]}" 2>/dev/null || RC=$?
    unset "PID[$1]"
}

# restart_crashed DIR: restarts every server that died without being killed here (as Kubernetes would),
# counted in CRASHES; its log's last line says why.
restart_crashed() {
    local dir=$1 i r name
    while read -r i r; do
        name=$(server_name "$i" "$r")
        if ! kill -0 "${PID[$name]}" 2>/dev/null; then
            reap "$name"
            CRASHES=$((CRASHES + 1))
            log "$name died on its own (exit $RC: $(tail -1 "$dir/$(server_file "$i" "$r").log" | cut -c1-160)); restarting it"
            restart "$dir" "$name"
        fi
    done < <(all_servers)
}

# run_job NAME KILLS: one whole job; sets FAULTS, LOST, DUPS, PAUSE, AUC.
run_job() {
    local name=$1 kills=$2 dir="$TMP/$1"
    mkdir -p "$dir/ckpt"
    # Certificates like production's (issue 39): the server certificate names only ps and *.ps, no localhost
    # nor 127.0.0.1; every process dials with the name ps, and each presents its role's certificate.
    "$B/ps-server" certs init --tls-dir "$dir/tls" --only-names --name "$TLS_NAME" --name "*.$TLS_NAME" >/dev/null
    start_servers "$dir"
    start_auditor "$dir"
    start_trainer "$dir" 0
    start_trainer "$dir" 1
    log "$name: servers $PS, durability $DURABILITY, $REPLICAS replica(s) per shard, $kills faults to inject"
    local started
    started=$(now_ms)

    RANDOM=$SEED
    FAULTS=0
    DISK_FULLS=0
    PARTITIONS=0
    CRASHES=0
    local done0=0 done1=0 misses=0
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
        restart_crashed "$dir"
        local victims=()
        if [ "$REPLICAS" = 1 ]; then victims=(ps0 ps1 audit); fi
        for r in 0 1; do
            local d="done$r"
            if [ "${!d}" = 0 ]; then
                if kill -0 "${PID[trainer$r]}" 2>/dev/null; then
                    if [ "$REPLICAS" = 1 ]; then victims+=("trainer$r"); fi
                else
                    finished "$r"; printf -v "done$r" 1
                fi
            fi
        done
        if [ "$REPLICAS" -gt 1 ]; then  # the current primary of a random shard
            mapfile -t victims < <(primaries)
            if [ ${#victims[@]} = 0 ]; then
                misses=$((misses + 1))
                log "$name: no replica reports ps_replica_primary 1 (a failover in progress?); waiting"
                if [ $misses -ge 20 ]; then
                    echo "chaos: $name: no primary found in 20 rounds; see $dir/ps-*.log" >&2; exit 1
                fi
                continue
            fi
            misses=0
        fi
        local victim=${victims[$((RANDOM % ${#victims[@]}))]}
        # What this fault is: a kill, a full disk or a partition (equally likely among those enabled).
        local kinds=(kill) kind
        [ "$DISK_FAULTS" = 1 ] && kinds+=(disk)
        [ "$PARTITION_FAULTS" = 1 ] && kinds+=(partition)
        kind=${kinds[$((RANDOM % ${#kinds[@]}))]}
        if [ "$kind" = partition ]; then
            local cut
            if [ "$REPLICAS" -gt 1 ]; then
                cut=$victim  # the current primary of a random shard, as for kills
            else
                cut=$(all_servers | sed -n "$((RANDOM % (SHARDS * REPLICAS) + 1))p")
                cut=$(server_name ${cut% *} ${cut#* })
            fi
            FAULTS=$((FAULTS + 1))
            PARTITIONS=$((PARTITIONS + 1))
            log "$name: fault $FAULTS: $cut cut off from every other process for ${PARTITION_SECS}s"
            partition "$cut" on
            local t
            for t in $(seq 1 $((PARTITION_SECS * 5))); do
                sleep 0.2
                restart_crashed "$dir"
            done
            partition "$cut" off
            log "$name: $cut reachable again"
            restart_crashed "$dir"
            continue
        fi
        if [ "$kind" = disk ]; then
            # A full disk on a random server instead of a kill.
            local full
            full=$(all_servers | sed -n "$((RANDOM % (SHARDS * REPLICAS) + 1))p")
            local disk="$dir/$(server_file ${full% *} ${full#* })"
            dd if=/dev/zero of="$disk/filler" bs=1M 2>/dev/null || true
            FAULTS=$((FAULTS + 1))
            DISK_FULLS=$((DISK_FULLS + 1))
            log "$name: fault $FAULTS: the disk of $(server_name ${full% *} ${full#* }) full ($(df --output=avail -B1 "$disk" | tail -1) bytes free) for ${DISK_FULL_SECS}s"
            local t
            local fullname
            fullname=$(server_name ${full% *} ${full#* })
            for t in $(seq 1 $((DISK_FULL_SECS * 5))); do
                sleep 0.2
                # A server that died of it restarts on a freed disk (it could not open its database on a full one).
                kill -0 "${PID[$fullname]}" 2>/dev/null || rm -f "$disk/filler"
                restart_crashed "$dir"
            done
            rm -f "$disk/filler"
            restart_crashed "$dir"
            continue
        fi
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
    verdict=$("$B/ps-audit" verify --ps "$PS" --tls-dir "$dir/tls" --server-name "$TLS_NAME" --log "$dir/acks.log" | tail -1)
    log "$name: $verdict"
    LOST=$(sed -n 's/.*lost_acked_updates=\([0-9]*\).*/\1/p' <<< "$verdict")
    DUPS=$(sed -n 's/.*duplicates=\([0-9]*\).*/\1/p' <<< "$verdict")
    UNACKED=$(sed -n 's/.*unacked_applied=\([0-9]*\).*/\1/p' <<< "$verdict")
    PAUSE=$(sed -n 's/.*max_pause_s=\([0-9.]*\).*/\1/p' <<< "$verdict")
    AUC=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["auc"] or "")' "$dir/summary-0.json")
    [ -n "$LOST" ] && [ -n "$PAUSE" ] && [ -n "$AUC" ] || { echo "chaos: $name: no audit verdict or AUC" >&2; exit 1; }
    local i r
    while read -r i r; do kill -TERM "${PID[$(server_name "$i" "$r")]}"; done < <(all_servers)
    while read -r i r; do reap "$(server_name "$i" "$r")"; done < <(all_servers)
}

run_job undisturbed 0
UNDISTURBED_AUC=$AUC
[ "$LOST" = 0 ] || log "WARNING: the undisturbed run lost $LOST acknowledged updates"
log "undisturbed run: longest pause of a shard ${PAUSE}s"
run_job chaos "$KILLS"
[ "$DISK_FAULTS" = 1 ] && log "chaos run: $DISK_FULLS of the faults were full disks"
[ "$PARTITION_FAULTS" = 1 ] && log "chaos run: $PARTITIONS of the faults were network partitions"
[ "$CRASHES" = 0 ] || log "chaos run: servers died on their own $CRASHES times (restarted)"
log "chaos run: $FAULTS faults, $DUPS increments applied twice, ${UNACKED:-0} of pushes never acknowledged, flush interval ${FLUSH}s"
printf 'faults=%d lost_acked_updates=%d max_pause_s=%s duplicates=%d unacked_applied=%d auc=%.4f undisturbed_auc=%.4f\n' \
    "$FAULTS" "$LOST" "$PAUSE" "$DUPS" "${UNACKED:-0}" "$AUC" "$UNDISTURBED_AUC"
