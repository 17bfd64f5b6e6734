#!/usr/bin/env bash
# The capacity tier (issue 17) over budget factors, id distributions and prefetch distances, one line per
# configuration:
#   factor=F dist=D prefetch=P pull_rows_s=X push_rows_s=Y pull_p50_ms=A pull_p99_ms=B hit_ratio=H readback_rows_s=R
#
# One ps-server pinned to one core (SERVER_CPU, default 0), ps-bench to the other (CLIENT_CPU, default 1). Every
# configuration gets a fresh server and data directory (deleted after its run, so disk use stays at one
# table set: V x 4 tables x ~100 bytes, 0.8 GB at the default V). Workload: 4 tables, dim 16, row-wise Adagrad,
# f16, concurrency 4, each batch pulled then pushed; ids uniform or Zipf(ZIPF_S, default 1.1) over V ranks
# per table (default 500,000). The load cycles through POOL_BATCHES (default 1000) pre-drawn batches of 2048
# ids per table: 2M draws per table, which touch ~98% of 500k uniform ids, so the over-budget factor is the
# workload's (a pool drawing fewer ids than V would shrink the working set below V). Budget per table (--memory-budget-rows) = V / factor: factor 1 is a budget
# that holds every row (the tier's bookkeeping without evictions); factor 0 starts the server with no budget.
#
# Per configuration, two ps-bench runs against the same server:
#  1. the warm-up: `--populate-rows V` (every table holds exactly V rows, so factor F means F x the budget and
#     no pull finds a missing row; `--populate` would only push the pooled batches' ids, about 63% of V for
#     uniform draws, and fewer for Zipf, which leaves the over-budget factor unknown), then WARMUP seconds of
#     the measured load itself (same flags), which moves the memory tier from "the last rows populated" to the
#     workload's own working set; then waits until eviction has brought the tables back to their budgets
#     (ps_rows_over_budget at most 1% of the budgets), so the measured run starts at the budget;
#  2. the measured run, SECONDS_RUN seconds with no warm-up of its own, between two scrapes of the server's
#     /metrics. The server's counters move only while ps-bench sends load (connecting and building the batch
#     pool send nothing), so their increase belongs to the measured seconds.
# hit_ratio = hit / (hit + miss + late) of ps_tier_rows_total (pulled rows of budgeted tables: in memory, read
# back by the pull, waited for a prefetch's read); 1.0 when no row was counted (factor 0: no budget).
# readback_rows_s = increase of ps_readback_rows_total / SECONDS_RUN (read-backs by pulls, pushes and prefetches).
#
# Usage: scripts/bench/tier_sweep.sh [OUT_DIR]
#   env: V (500000), FACTORS ("1 2 4 8"), DISTS ("uniform zipf"), PREFETCH (P, default 4; runs use 0 and P),
#        SECONDS_RUN (10), WARMUP (2), ZIPF_S (1.1), POOL_BATCHES (1000), SERVER_CPU, CLIENT_CPU,
#        SERVER_ARGS (extra ps-server flags), CONCURRENCY (batches in flight, 4), RATE_ARGS (extra ps-bench
#        flags of the measured run, e.g. "--rate 15" for an open loop at 15 batches/s: p99 at a fixed offered
#        load), R (binaries; default $CARGO_TARGET_DIR/release, else target/release)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /var/tmp/tier-sweep.XXXXXX)}
mkdir -p "$OUT"
R=${R:-${CARGO_TARGET_DIR:-target}/release}
V=${V:-500000}
FACTORS=${FACTORS:-1 2 4 8}
DISTS=${DISTS:-uniform zipf}
P=${PREFETCH:-4}
SECONDS_RUN=${SECONDS_RUN:-10}
WARMUP=${WARMUP:-2}
ZIPF_S=${ZIPF_S:-1.1}
POOL=${POOL_BATCHES:-1000}
PIN_S=(taskset -c "${SERVER_CPU:-0}")
PIN_C=(taskset -c "${CLIENT_CPU:-1}")
for b in ps-server ps-bench; do
  [ -x "$R/$b" ] || { echo "missing $R/$b: cargo build --release -p bench -p ps-server --bins" >&2; exit 2; }
done
df -h "$OUT" >&2

SERVER_PID=
stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
  fi
  rm -rf "$OUT/server/data"
}
trap stop_server EXIT

# Starts a fresh ps-server with BUDGET rows per table (0 = none); sets ADDR, MADDR, TLS.
start_server() {
  local budget=$1 dir=$OUT/server
  rm -rf "$dir/data" "$dir/ready"
  mkdir -p "$dir"
  local args=()
  [ "$budget" -gt 0 ] && args+=(--memory-budget-rows "$budget")
  "${PIN_S[@]}" "$R/ps-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir "$dir/data" \
    --tls-dir "$dir/tls" --dev-certs "${args[@]}" ${SERVER_ARGS:-} >"$dir/ready" 2>>"$dir/ps.log" &
  SERVER_PID=$!
  for _ in $(seq 1 600); do
    grep -q "ready" "$dir/ready" 2>/dev/null && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "ps-server exited; see $dir/ps.log" >&2; exit 1; }
    sleep 0.1
  done
  ADDR=$(grep -o 'quic=[^ ]*' "$dir/ready" | cut -d= -f2)
  MADDR=$(grep -o 'metrics=[^ ]*' "$dir/ready" | cut -d= -f2)
  [ -n "$ADDR" ] && [ -n "$MADDR" ] || { echo "ps-server did not start; see $dir/ps.log" >&2; exit 1; }
  for _ in $(seq 1 600); do
    curl -sf "http://$MADDR/readyz" >/dev/null && break
    sleep 0.1
  done
  curl -sf "http://$MADDR/readyz" >/dev/null || { echo "ps-server not ready; see $dir/ps.log" >&2; exit 1; }
  TLS=$dir/tls
}

scrape() { curl -sf "http://$MADDR/metrics" >"$1"; }

for factor in $FACTORS; do
  if [ "$factor" = 0 ]; then budget=0; else budget=$((V / factor)); fi
  for dist in $DISTS; do
    for prefetch in 0 "$P"; do
      name=f$factor-$dist-p$prefetch
      start_server "$budget"
      load=(--ps "$ADDR" --tls-dir "$TLS" --tables 4 --dim 16 --optimizer row-adagrad --codec f16 --concurrency "${CONCURRENCY:-4}"
            --mix both --distribution "$dist" --zipf-s "$ZIPF_S" --vocab "$V" --pool-batches "$POOL"
            --prefetch-distance "$prefetch" --quiet)
      # Extra flags of the measured run only (e.g. RATE_ARGS="--rate 15": open loop at a fixed offered load).
      measured=(${RATE_ARGS:-})
      "${PIN_C[@]}" "$R/ps-bench" "${load[@]}" --populate-rows "$V" --warmup-seconds 0 --seconds "$WARMUP" \
        --seed 2 >/dev/null 2>"$OUT/$name.warmup.log" || { cat "$OUT/$name.warmup.log" >&2; exit 1; }
      if [ "$budget" -gt 0 ]; then
        for _ in $(seq 1 3000); do
          over=$(curl -sf "http://$MADDR/metrics" | awk '$1 == "ps_rows_over_budget" {print int($2)}')
          [ -z "$over" ] && break  # a server without the gauge (older build): nothing to wait for
          [ "$over" -le $((budget * 4 / 100)) ] && break
          sleep 0.1
        done
      fi
      scrape "$OUT/$name.before.prom"
      "${PIN_C[@]}" "$R/ps-bench" "${load[@]}" --warmup-seconds 0 --seconds "$SECONDS_RUN" --seed 1 \
        "${measured[@]}" --json "$OUT/$name.json" >/dev/null 2>"$OUT/$name.log" || { cat "$OUT/$name.log" >&2; exit 1; }
      scrape "$OUT/$name.after.prom"
      stop_server
      python3 - "$OUT/$name" "$factor" "$dist" "$prefetch" "$SECONDS_RUN" <<'PY'
import json, re, sys
base, factor, dist, prefetch, secs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
def prom(path):
    out = {}
    for line in open(path):
        m = re.match(r'^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?)\s+(\S+)$', line.strip())
        if m and not line.startswith('#'):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out
a, b = prom(base + ".before.prom"), prom(base + ".after.prom")
def inc(name):
    # Sum over every series of the metric whose labels contain each of `name`'s labels.
    metric, _, want = name.partition("{")
    want = [w for w in want.rstrip("}").split(",") if w]
    total = 0.0
    for key, v in b.items():
        m, _, labels = key.partition("{")
        if m == metric and all(w in labels for w in want):
            total += v - a.get(key, 0.0)
    return total
hit, miss, late = (inc(f'ps_tier_rows_total{{outcome="{o}"}}') for o in ("hit", "miss", "late"))
tiered = hit + miss + late
r = json.load(open(base + ".json"))
print(f"factor={factor} dist={dist} prefetch={prefetch} pull_rows_s={r['pull_rows_per_sec']:.0f} "
      f"push_rows_s={r['push_rows_per_sec']:.0f} pull_p50_ms={r['pull_p50_ms']:.2f} pull_p99_ms={r['pull_p99_ms']:.2f} "
      f"hit_ratio={hit / tiered if tiered else 1.0:.4f} readback_rows_s={inc('ps_readback_rows_total') / secs:.0f}",
      flush=True)
PY
    done
  done
done
echo "results in $OUT" >&2
