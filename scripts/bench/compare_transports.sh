#!/usr/bin/env bash
# Runs the same ps-bench workload against QUIC, TCP (TLS over TCP), the in-process engine (no network, no codec:
# the limit) and Redis as a naive parameter server (scripts/bench/redis_baseline.py), and prints one table.
#
# Every server is one process pinned to one core (SERVER_CPU, default 1) and the load generator another process
# pinned to the other core (CLIENT_CPU, default 0): "one server core". A fresh ps-server is started for every
# run (`--transport both`, default durability), so no run finds rows another created. Runs are interleaved
# (quic, tcp, quic, tcp, ...) RUNS times (default 3) and the table shows medians, with each run's figures in
# OUT_DIR/*.json. Then the unloaded latency: one batch pull at a time (--concurrency 1 --mix pull), per transport.
# Workload: 26 tables x 2048 ids per batch (deduplicated), dim 16, Zipf 1.1 over 10M ids per table, f16 rows
# and gradients (CODEC), row-wise Adagrad on the server, CONCURRENCY (default 4) batches in flight, each pulled
# then pushed, 1 s warm-up then SECONDS_PER_RUN (default 10) measured. Redis: Debian's redis-server on loopback,
# persistence off; skipped with a note when redis-server is absent.
# BEFORE_BIN=DIR (a directory with an earlier build's ps-server and ps-bench) adds a "quic-before" row run with
# those binaries, interleaved with the others (quic, quic-before, tcp, ...): a before/after comparison in one run.
# Usage: scripts/bench/compare_transports.sh [OUT_DIR]
#   env: SECONDS_PER_RUN, CONCURRENCY, RUNS, CODEC, SERVER_CPU, CLIENT_CPU, EXTRA_ARGS (ps-bench), SKIP_BUILD=1,
#        BIN_DIR (default target/release), BEFORE_BIN, SERVER_ARGS (extra ps-server flags), SERVER_ENV (e.g.
#        TOKIO_WORKER_THREADS=2, for every ps-server of the run), SKIP_REDIS=1, SKIP_IN_PROCESS=1
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /tmp/compare-transports.XXXXXX)}
mkdir -p "$OUT"
SECS=${SECONDS_PER_RUN:-10}
CONC=${CONCURRENCY:-4}
RUNS=${RUNS:-3}
CODEC=${CODEC:-f16}
SCPU=${SERVER_CPU:-1}
CCPU=${CLIENT_CPU:-0}
WORKLOAD=(--tables 26 --dim 16 --ids-per-table 2048 --distribution zipf --zipf-s 1.1 --vocab 10000000
          --warmup-seconds 1 --seed 1)
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p bench -p ps-server --bins
B=${BIN_DIR:-target/release}
BEFORE=${BEFORE_BIN:-}
PIN_S=(taskset -c "$SCPU")
PIN_C=(taskset -c "$CCPU")

SERVER_PID=
stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
  fi
}
trap stop_server EXIT

# Starts a fresh ps-server on one core; sets SERVER_PID and ADDR (UDP and TCP, same port).
start_server() {
  local dir=$OUT/server
  rm -rf "$dir/data"
  mkdir -p "$dir"
  env ${SERVER_ENV:-} "${PIN_S[@]}" "${SB:-$B}/ps-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir "$dir/data" \
    --tls-dir "$dir/tls" --dev-certs --transport both ${SERVER_ARGS:-} >"$dir/ready" 2>>"$dir/ps.log" &
  SERVER_PID=$!
  for _ in $(seq 1 600); do
    if grep -q "ready" "$dir/ready" 2>/dev/null; then break; fi
    sleep 0.1
  done
  ADDR=$(grep -o 'quic=[^ ]*' "$dir/ready" | cut -d= -f2)
  [ -n "$ADDR" ] || { echo "ps-server did not start; see $dir/ps.log" >&2; exit 1; }
  TLS=$dir/tls
}

bench() { # NAME TRANSPORT ARGS...: one run against a fresh server (binaries from SB, default B)
  local name=$1 transport=$2
  shift 2
  start_server
  "${PIN_C[@]}" "${SB:-$B}/ps-bench" --ps "$ADDR" --tls-dir "$TLS" --transport "$transport" --codec "$CODEC" \
    "${WORKLOAD[@]}" "$@" --quiet --json "$OUT/$name.json" ${EXTRA_ARGS:-} >/dev/null
  stop_server
}

for r in $(seq 1 "$RUNS"); do
  for t in quic tcp; do
    echo "== run $r: $t" >&2
    bench "$t-$r" "$t" --concurrency "$CONC" --mix both --seconds "$SECS"
    if [ -n "$BEFORE" ] && [ "$t" = quic ]; then
      echo "== run $r: quic-before ($BEFORE)" >&2
      SB=$BEFORE bench "quic-before-$r" quic --concurrency "$CONC" --mix both --seconds "$SECS"
    fi
  done
  if [ "${SKIP_IN_PROCESS:-0}" != 1 ]; then
    echo "== run $r: in-process engine" >&2
    "${PIN_S[@]}" "$B/ps-bench" --in-process --codec "$CODEC" "${WORKLOAD[@]}" --concurrency "$CONC" --mix both \
      --seconds "$SECS" --quiet --json "$OUT/in-process-$r.json" >/dev/null
  fi
done
for t in quic tcp ${BEFORE:+quic-before}; do
  echo "== unloaded: $t, one batch pull at a time" >&2
  if [ "$t" = quic-before ]; then
    SB=$BEFORE bench "unloaded-$t" quic --concurrency 1 --mix pull --seconds "$SECS"
  else
    bench "unloaded-$t" "$t" --concurrency 1 --mix pull --seconds "$SECS"
  fi
done

echo "== redis" >&2
if [ "${SKIP_REDIS:-0}" = 1 ]; then
  echo '{"skipped": "SKIP_REDIS=1"}' >"$OUT/redis.json"
elif command -v redis-server >/dev/null; then
  PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "${PIN_S[@]}" redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no >"$OUT/redis.log" 2>&1 &
  REDIS_PID=$!
  sleep 0.5
  "${PIN_C[@]}" python3 scripts/bench/redis_baseline.py --redis "127.0.0.1:$PORT" "${WORKLOAD[@]}" \
    --concurrency "$CONC" --mix both --seconds "$SECS" --quiet --json "$OUT/redis.json" || true
  kill "$REDIS_PID" 2>/dev/null || true
  wait "$REDIS_PID" 2>/dev/null || true
else
  echo "redis-server is not installed (Debian: apt-get install redis-server): Redis row skipped" >&2
  echo '{"skipped": "redis-server is not installed"}' >"$OUT/redis.json"
fi

python3 - "$OUT" "$RUNS" "$(uptime)" <<'PY'
import json, os, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
print(f"\nload at the end: {sys.argv[3].strip()}")
def load(name):
    with open(os.path.join(out, name + ".json")) as f:
        return json.load(f)
def med(rs, key):
    return statistics.median(r[key] for r in rs)
names = [n for n in ("quic", "quic-before", "tcp", "in-process") if os.path.exists(os.path.join(out, f"{n}-1.json"))]
rows = {n: [load(f"{n}-{i}") for i in range(1, runs + 1)] for n in names}
redis = load("redis")
if "skipped" not in redis:
    rows["redis"] = [redis]
print(f"\nresults in {out} (medians of {runs} runs; redis: 1 run)")
print("| transport | pull rows/s | push rows/s | pull p50 / p99 ms | push p50 / p99 ms | wire B/pulled row | pull vs tcp | pull vs redis |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
tcp = med(rows["tcp"], "pull_rows_per_sec")
red = med(rows["redis"], "pull_rows_per_sec") if "redis" in rows else None
for name, rs in rows.items():
    pull = med(rs, "pull_rows_per_sec")
    print(f"| {name} | {pull:,.0f} | {med(rs, 'push_rows_per_sec'):,.0f} | "
          f"{med(rs, 'pull_p50_ms'):.2f} / {med(rs, 'pull_p99_ms'):.2f} | "
          f"{med(rs, 'push_p50_ms'):.2f} / {med(rs, 'push_p99_ms'):.2f} | "
          f"{med(rs, 'wire_bytes_per_pulled_row'):.1f} | {pull / tcp:.2f}x | "
          + (f"{pull / red:.1f}x |" if red else "- |"))
if "redis" not in rows:
    print(f"| redis | skipped: {redis['skipped']} | | | | | | |")
print("\nper run (pull rows/s): " + "; ".join(
    f"{n}: " + ", ".join(f"{r['pull_rows_per_sec'] / 1e6:.2f}M" for r in rs) for n, rs in rows.items()))
for q in [n for n in ("quic", "quic-before") if n in rows]:
    print(f"{q} / tcp per run: " + ", ".join(
        f"{a['pull_rows_per_sec'] / t['pull_rows_per_sec']:.2f}" for a, t in zip(rows[q], rows["tcp"])))
print("\n| unloaded (concurrency 1, pull only) | pull p50 ms | pull p99 ms | pull p999 ms | pull rows/s |")
print("| --- | --- | --- | --- | --- |")
for t in [n for n in ("quic", "quic-before", "tcp") if os.path.exists(os.path.join(out, f"unloaded-{n}.json"))]:
    r = load(f"unloaded-{t}")
    print(f"| {t} | {r['pull_p50_ms']:.2f} | {r['pull_p99_ms']:.2f} | {r['pull_p999_ms']:.2f} | {r['pull_rows_per_sec']:,.0f} |")
PY
