#!/usr/bin/env bash
# Push cost of replication (issue 22, docs/replication.md): the same ps-bench workload against local clusters
# of SHARDS shards (default 2) in `periodic` durability (1 replica), `sync` durability (1 replica: one synced
# RocksDB write per push) and `replicated` durability with 2 replicas per shard (a push waits for its in-sync
# backup to hold it in memory), and prints one table.
#
# Each run is one `ps-bench --local-cluster SHARDS [--replicas 2] --durability D`: fresh servers (ps-server
# next to ps-bench) in a fresh temporary directory, stopped at the end. Runs are interleaved (periodic, sync,
# replicated, periodic, ...) RUNS times (default 3) and the table shows medians, with each run's figures in
# OUT_DIR/<config>-<run>.json. CONFIGS picks and orders the configurations (default "periodic sync
# replicated"; also "periodic-r2": 2 replicas in periodic durability, backups fed without waiting, and "none").
# Workload: 26 tables x 2048 ids per batch (deduplicated), dim 16, Zipf 1.1 over 10M ids per table, f16
# gradients, row-wise Adagrad, CONCURRENCY (default 4) batches in flight, MIX (default push: pushes only, the
# cost measured; `both` for a pull then a push), 1 s warm-up then SECONDS_PER_RUN (default 10) measured.
# Loopback: the replication stream costs CPU on the same machine, no network latency.
# Usage: scripts/bench/replication_cost.sh [OUT_DIR]
#   env: SECONDS_PER_RUN, CONCURRENCY, RUNS, MIX, SHARDS, CONFIGS, EXTRA_ARGS (ps-bench), SERVER_ARGS (extra
#        ps-server flags, each passed as --server-arg), SKIP_BUILD=1, BIN_DIR (default
#        ${CARGO_TARGET_DIR:-target}/release)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /tmp/replication-cost.XXXXXX)}
mkdir -p "$OUT"
SECS=${SECONDS_PER_RUN:-10}
CONC=${CONCURRENCY:-4}
RUNS=${RUNS:-3}
MIX=${MIX:-push}
SHARDS=${SHARDS:-2}
read -r -a CONFIG_LIST <<< "${CONFIGS:-periodic sync replicated}"
WORKLOAD=(--tables 26 --dim 16 --ids-per-table 2048 --distribution zipf --zipf-s 1.1 --vocab 10000000
          --codec f16 --warmup-seconds 1 --seed 1)
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p bench -p ps-server --bins
B=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
SERVER_FLAGS=()
for f in ${SERVER_ARGS:-}; do SERVER_FLAGS+=("--server-arg=$f"); done

# cluster_flags CONFIG: the ps-bench flags that start the configuration's local cluster.
cluster_flags() {
  case "$1" in
    periodic) echo "--durability periodic" ;;
    sync) echo "--durability sync" ;;
    none) echo "--durability none" ;;
    replicated) echo "--replicas 2 --durability replicated" ;;
    periodic-r2) echo "--replicas 2 --durability periodic" ;;
    *) echo "replication_cost: unknown configuration $1 (periodic, sync, none, replicated, periodic-r2)" >&2; exit 2 ;;
  esac
}
for c in "${CONFIG_LIST[@]}"; do cluster_flags "$c" >/dev/null; done

for r in $(seq 1 "$RUNS"); do
  for c in "${CONFIG_LIST[@]}"; do
    echo "== run $r: $c" >&2
    # shellcheck disable=SC2046 # the configuration's flags are words
    "$B/ps-bench" --local-cluster "$SHARDS" $(cluster_flags "$c") "${SERVER_FLAGS[@]}" "${WORKLOAD[@]}" \
      --concurrency "$CONC" --mix "$MIX" --seconds "$SECS" --quiet --json "$OUT/$c-$r.json" ${EXTRA_ARGS:-} >/dev/null
  done
done

python3 - "$OUT" "$RUNS" "$MIX" "$SHARDS" "$(uptime)" "${CONFIG_LIST[@]}" <<'PY'
import json, os, statistics, sys
out, runs, mix, shards, load = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
configs = sys.argv[6:]
def get(name):
    with open(os.path.join(out, name + ".json")) as f:
        return json.load(f)
rows = {c: [get(f"{c}-{i}") for i in range(1, runs + 1)] for c in configs}
def med(rs, key):
    return statistics.median(r[key] for r in rs)
print(f"\nload at the end: {load.strip()}")
print(f"results in {out} (medians of {runs} runs; {shards} shards, mix {mix})")
base = "periodic" if "periodic" in rows else configs[0]
bpush = med(rows[base], "push_rows_per_sec")
print(f"| durability | replicas | push rows/s | push p50 / p99 / p999 ms | pull rows/s | push rows/s vs {base} |")
print("| --- | --- | --- | --- | --- | --- |")
for c, rs in rows.items():
    cfg = rs[0]["config"]
    push = med(rs, "push_rows_per_sec")
    ratio = f"{push / bpush:.2f}x" if bpush else "-"
    print(f"| {cfg.get('durability') or 'default'} | {cfg.get('replicas', 1)} | {push:,.0f} | "
          f"{med(rs, 'push_p50_ms'):.2f} / {med(rs, 'push_p99_ms'):.2f} / {med(rs, 'push_p999_ms'):.2f} | "
          f"{med(rs, 'pull_rows_per_sec'):,.0f} | {ratio} |")
print("\nper run (push rows/s): " + "; ".join(
    f"{c}: " + ", ".join(f"{r['push_rows_per_sec'] / 1e3:.0f}k" for r in rs) for c, rs in rows.items()))
PY
