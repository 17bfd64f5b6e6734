#!/usr/bin/env bash
# Runs the same ps-bench workload three ways and prints a table: QUIC against one local ps-server, the
# in-process engine (no network, no codec) and Redis as a naive parameter server (bench/scripts/redis_baseline.py).
# Workload: 26 tables x 2048 ids per batch (deduplicated), dim 16, Zipf 1.1 over 10M ids per table, f16 rows,
# 4 batches in flight, each batch pulled then pushed, 1 s warm-up then SECONDS (default 10) measured.
# Usage: bench/scripts/compare_transports.sh [OUT_DIR]   (env: SECONDS_PER_RUN, CONCURRENCY, EXTRA_ARGS)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /tmp/compare-transports.XXXXXX)}
mkdir -p "$OUT"
SECS=${SECONDS_PER_RUN:-10}
CONC=${CONCURRENCY:-4}
WORKLOAD=(--tables 26 --dim 16 --ids-per-table 2048 --distribution zipf --zipf-s 1.1 --vocab 10000000
          --concurrency "$CONC" --mix both --seconds "$SECS" --warmup-seconds 1 --seed 1)
cargo build --release -q -p bench -p ps-server --bins
B=target/release
echo "== quic, 1 local ps-server" >&2
$B/ps-bench --local-cluster 1 --codec f16 "${WORKLOAD[@]}" --quiet --json "$OUT/quic.json" ${EXTRA_ARGS:-}
echo "== in-process engine" >&2
$B/ps-bench --in-process --codec f16 "${WORKLOAD[@]}" --quiet --json "$OUT/in-process.json" ${EXTRA_ARGS:-}
echo "== redis" >&2
python3 bench/scripts/redis_baseline.py "${WORKLOAD[@]}" --quiet --json "$OUT/redis.json"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = []
for name in ("quic", "in-process", "redis"):
    with open(os.path.join(out, name + ".json")) as f:
        rows.append((name, json.load(f)))
base = rows[0][1].get("pull_rows_per_sec") or 1.0
print(f"\nresults in {out}")
print("| transport | pull rows/s | push rows/s | pull p50 / p99 / p999 ms | push p50 / p99 ms | wire B/pulled row | wire MB/s | pull vs quic |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for name, r in rows:
    if "skipped" in r:
        print(f"| {name} | skipped: {r['skipped']} | | | | | | |")
        continue
    print(f"| {name} | {r['pull_rows_per_sec']:,.0f} | {r['push_rows_per_sec']:,.0f} | "
          f"{r['pull_p50_ms']:.1f} / {r['pull_p99_ms']:.1f} / {r['pull_p999_ms']:.1f} | "
          f"{r['push_p50_ms']:.1f} / {r['push_p99_ms']:.1f} | {r['wire_bytes_per_pulled_row']:.1f} | "
          f"{r['wire_mb_per_sec']:.1f} | {r['pull_rows_per_sec'] / base:.2f}x |")
PY
