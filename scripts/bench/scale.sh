#!/usr/bin/env bash
# The capacity tier at scale (issue 17): one pass of DLRM (dim 16, row-wise Adagrad) over generated data whose
# tables hold ROWS_DISTINCT-ish distinct rows in all, through SERVERS ps-servers whose memory budget keeps at
# most a quarter of the rows in memory; the rest live only in RocksDB.
#
# The training data is never written to disk: gen-criteo streams it into the trainer's standard input
# (`--vocab-scale` / `--scaled-zipf` spread the five largest columns so one pass touches many distinct ids;
# bench/src/gen/scale.rs gives the distinct counts: 100M rows at --vocab-scale 40 --scaled-zipf 0.8 touch
# about 239M rows over all tables, 150M rows about 322M). Only the test file and the servers' RocksDB
# directories take disk: about 100 bytes per distinct row after compaction (`ps-server plan`), so check
# `df` first (the script refuses to start with less than DISK_NEEDED_GB free).
#
# Prints two lines:
#   rows=N distinct_rows=D in_memory_share=F wall_s=W samples_per_s=S auc=A disk_bytes=B
#   rss_trainer=R rss_server_max=R plan_resident_per_server=P rss_vs_plan=X
#   at_peak_rss: secs=T server=I rss=.. rows=.. memtables=.. block_cache=.. table_readers=.. other=..
#     jemalloc_allocated=.. allocated_other=.. allocator_slack=.. jemalloc_metadata=.. outside_jemalloc=..
# (the second from the servers' memory gauges, sampled every 5 s into OUT/memory.tsv)
# and keeps every log, the summary and the servers' last /metrics under OUT.
#
# Usage: scripts/bench/scale.sh [OUT]
#   env: ROWS (training rows, 150000000), TEST_ROWS (200000), VOCAB_SCALE (40), SCALED_ZIPF (0.8),
#        SERVERS (2), BUDGET (rows per table per server kept in memory, 5000000), BATCH (4096),
#        DISK_NEEDED_GB (40), R (binaries; default $CARGO_TARGET_DIR/release, else target/release),
#        MAX_SECONDS (unset: stop feeding rows after that many seconds; the trainer then ends its pass over the
#        rows it read, evaluates and writes its summary, and rows= reports the rows trained)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /var/tmp/scale.XXXXXX)}
mkdir -p "$OUT"
R=${R:-${CARGO_TARGET_DIR:-target}/release}
ROWS=${ROWS:-150000000}
TEST_ROWS=${TEST_ROWS:-200000}
VOCAB_SCALE=${VOCAB_SCALE:-40}
SCALED_ZIPF=${SCALED_ZIPF:-0.8}
SERVERS=${SERVERS:-2}
BUDGET=${BUDGET:-5000000}
BATCH=${BATCH:-4096}
for b in ps-server trainer gen-criteo; do
  [ -x "$R/$b" ] || { echo "missing $R/$b: cargo build --release --bins" >&2; exit 2; }
done
free_gb=$(df -BG --output=avail "$OUT" | tail -1 | tr -dc 0-9)
df -h "$OUT" >&2
if [ "$free_gb" -lt "${DISK_NEEDED_GB:-40}" ]; then
  echo "only ${free_gb} GB free under $OUT, need ${DISK_NEEDED_GB:-40}: lower ROWS or set DISK_NEEDED_GB" >&2
  exit 2
fi

gen=(--vocab-scale "$VOCAB_SCALE" --scaled-zipf "$SCALED_ZIPF" --teacher-seed 7)
"$R/gen-criteo" --rows "$TEST_ROWS" --seed 2 "${gen[@]}" --out "$OUT/test.tsv" 2>"$OUT/gen-test.log"

"$R/ps-server" certs init --tls-dir "$OUT/tls" >/dev/null
pids=() ; ps=() ; metrics=()
for i in $(seq 0 $((SERVERS - 1))); do
  "$R/ps-server" --listen "127.0.0.1:$((7600 + i))" --metrics-listen "127.0.0.1:$((9600 + i))" \
    --data-dir "$OUT/ps$i" --shard-index "$i" --num-shards "$SERVERS" --tls-dir "$OUT/tls" \
    --memory-budget-rows "$BUDGET" >"$OUT/ps$i.log" 2>&1 &
  pids+=($!) ; ps+=("127.0.0.1:$((7600 + i))") ; metrics+=("127.0.0.1:$((9600 + i))")
done
for m in "${metrics[@]}"; do
  until curl -sf "http://$m/readyz" >/dev/null; do sleep 0.2; done
done
stop() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT

start=$(date +%s.%N)
"$R/gen-criteo" --rows "$ROWS" --seed 1 "${gen[@]}" --out /dev/stdout 2>"$OUT/gen-train.log" |
  "$R/trainer" train --ps "$(IFS=,; echo "${ps[*]}")" --tls-dir "$OUT/tls" --train /dev/stdin --test "$OUT/test.tsv" \
    --batch-size "$BATCH" --summary-json "$OUT/summary.json" >"$OUT/trainer.log" 2>&1 &
trainer_pid=$!
# The trainer is the pipeline's last process: its peak RSS is read while it runs (it exits at the end).
# Every 5 s each server's memory gauges go to OUT/memory.tsv (seconds, server, then the gauges in the order of
# the header), for the breakdown at the servers' peak.
rss_trainer=0 ; tick=0
printf 'secs\tserver\trss\trows\tmemtables\tblock_cache\ttable_readers\tjemalloc_allocated\tjemalloc_resident\tjemalloc_metadata\n' >"$OUT/memory.tsv"
while kill -0 "$trainer_pid" 2>/dev/null; do
  tp=$(pgrep -n -x trainer || true)
  if [ -n "$tp" ]; then
    r=$(awk '/VmHWM/ {print $2}' "/proc/$tp/status" 2>/dev/null || echo 0)
    [ "${r:-0}" -gt "$rss_trainer" ] && rss_trainer=$r
  fi
  if [ -n "${MAX_SECONDS:-}" ] && [ "$tick" -eq "$MAX_SECONDS" ]; then
    echo "MAX_SECONDS=$MAX_SECONDS reached: no more rows" >&2
    pkill -P $$ -x gen-criteo || true
  fi
  if [ $((tick % 5)) -eq 0 ]; then
    for i in "${!metrics[@]}"; do
      curl -sf "http://${metrics[$i]}/metrics" | awk -v t="$tick" -v s="$i" '
        /^ps_process_resident_bytes / {rss = $2}
        /^ps_memory_bytes / {rows = $2}
        /^ps_rocksdb_memory_bytes\{kind="memtables"\}/ {mt = $2}
        /^ps_rocksdb_memory_bytes\{kind="block_cache"\}/ {bc = $2}
        /^ps_rocksdb_memory_bytes\{kind="table_readers"\}/ {tr = $2}
        /^ps_allocator_bytes\{kind="allocated"\}/ {ja = $2}
        /^ps_allocator_bytes\{kind="resident"\}/ {jr = $2}
        /^ps_allocator_bytes\{kind="metadata"\}/ {jm = $2}
        END {if (rss != "") printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t, s, rss, rows, mt, bc, tr, ja, jr, jm}' \
        >>"$OUT/memory.tsv" || true
    done
  fi
  tick=$((tick + 1))
  sleep 1
done
wait "$trainer_pid"
wall=$(echo "$(date +%s.%N) - $start" | bc)
rss_server=0 ; distinct=0 ; in_memory=0
for i in "${!pids[@]}"; do
  r=$(awk '/VmHWM/ {print $2}' "/proc/${pids[$i]}/status")
  [ "$r" -gt "$rss_server" ] && rss_server=$r
  curl -sf "http://${metrics[$i]}/metrics" >"$OUT/ps$i.prom"
done
stop
trap - EXIT
disk=$(du -sb "$OUT"/ps* -d0 2>/dev/null | awk '$2 ~ /ps[0-9]+$/ {s += $1} END {print s}')
python3 - "$OUT" "$ROWS" "$wall" "$disk" "$rss_trainer" "$rss_server" "$R" "$SERVERS" "$BUDGET" <<'PY'
import json, re, subprocess, sys
out, rows, wall, disk, rss_t, rss_s, r, servers, budget = sys.argv[1:]
servers, budget = int(servers), int(budget)
s = json.load(open(f"{out}/summary.json"))
mem = disk_rows = 0.0
for i in range(servers):
    for line in open(f"{out}/ps{i}.prom"):
        if line.startswith("ps_rows_in_memory{"):
            mem += float(line.split()[-1])
        if line.startswith("ps_rows_on_disk{"):
            disk_rows += float(line.split()[-1])
distinct = max(disk_rows, mem)
# plan's prediction for one server: its share of the distinct rows, with the rows it held in memory as its
# memory budget (plan's bytes per row in memory, about 84 at dim 16 with row-wise Adagrad).
plan = subprocess.run([f"{r}/ps-server", "plan", "--rows", str(int(distinct / servers)), "--dim", "16",
                       "--memory-budget", str(int(mem / servers * 84)), "--server-memory", "1TiB"],
                      capture_output=True, text=True).stdout
open(f"{out}/plan.txt", "w").write(plan)
m = re.search(r"predicted resident memory per server: ([\d.]+) (\w+)", plan)
unit = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
pred = float(m.group(1)) * unit[m.group(2)] if m else float("nan")
print(f"rows={s['samples']} distinct_rows={distinct:.0f} in_memory_share={mem / distinct if distinct else 0:.3f} "
      f"wall_s={float(wall):.0f} samples_per_s={s['samples_per_sec']:.0f} auc={s['auc']:.4f} disk_bytes={disk} "
      f"rss_trainer={int(rss_t) * 1024} rss_server_max={int(rss_s) * 1024} plan_resident_per_server={pred:.0f} "
      f"rss_vs_plan={int(rss_s) * 1024 / pred:.3f}")
# The servers' memory at the sample with the highest RSS (gauges refresh with each write-back).
rows_tsv = [l.split("\t") for l in open(f"{out}/memory.tsv").read().splitlines()[1:]]
rows_tsv = [[float(x or 0) for x in r] for r in rows_tsv if len(r) == 10]
if rows_tsv:
    t, srv, rss, rowb, mt, bc, tr, ja, jr, jm = max(rows_tsv, key=lambda r: r[2])
    mib = lambda b: f"{b / 2**20:.0f}MiB"
    # other = what no gauge names; allocated_other = what the program holds beyond the named parts (from
    # jemalloc's count), slack = allocator pages resident but not allocated (fragmentation, dirty pages).
    print(f"at_peak_rss: secs={t:.0f} server={srv:.0f} rss={mib(rss)} rows={mib(rowb)} memtables={mib(mt)} "
          f"block_cache={mib(bc)} table_readers={mib(tr)} other={mib(rss - rowb - mt - bc - tr)} "
          f"jemalloc_allocated={mib(ja)} allocated_other={mib(ja - rowb - mt - bc - tr)} "
          f"allocator_slack={mib(jr - ja)} jemalloc_metadata={mib(jm)} outside_jemalloc={mib(rss - jr)}")
PY
