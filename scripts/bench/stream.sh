#!/usr/bin/env bash
# Issue 21's streaming figure: progressive AUC over time while rows are appended to the input file.
# Generates ROWS rows (gen-criteo, teacher 7) and a test set, starts SERVERS ps-servers and `trainer train
# --follow` on an empty file, then appends CHUNK rows every INTERVAL seconds. After each append it records one
# line from the trainer's /metrics: seconds since the first append, rows appended, rows trained
# (trainer_samples_total), progressive AUC and logloss (trainer_progressive_auc/_logloss, window WINDOW rows,
# refreshed at each progress line, every second). Once every row is trained it sends SIGTERM and prints the
# trainer's summary (final checkpoint in OUT_DIR/ckpt, test AUC on the held-out rows).
# Usage: scripts/bench/stream.sh [OUT_DIR]
#   env: ROWS (default 600000), CHUNK (4000), INTERVAL (1.0 s), WINDOW (100000), SERVERS (2), BATCH (1024),
#        TEST_ROWS (50000), BIN_DIR (default $CARGO_TARGET_DIR/release or target/release), SKIP_BUILD=1,
#        TRAINER_ARGS (extra trainer flags)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /tmp/stream.XXXXXX)}
ROWS=${ROWS:-600000}
CHUNK=${CHUNK:-4000}
INTERVAL=${INTERVAL:-1.0}
WINDOW=${WINDOW:-100000}
SERVERS=${SERVERS:-2}
BATCH=${BATCH:-1024}
TEST_ROWS=${TEST_ROWS:-50000}
B=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
[ -n "${SKIP_BUILD:-}" ] || cargo build --release -q -p trainer -p ps-server -p bench --bins
mkdir -p "$OUT"
rm -rf "$OUT/ckpt" "$OUT"/ps*
"$B/gen-criteo" --rows "$ROWS" --seed 1 --teacher-seed 7 --out "$OUT/all.tsv" 2>"$OUT/gen.log"
"$B/gen-criteo" --rows "$TEST_ROWS" --seed 2 --teacher-seed 7 --out "$OUT/test.tsv" 2>>"$OUT/gen.log"
"$B/ps-server" certs init --tls-dir "$OUT/tls" >/dev/null

pids=()
stop() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop EXIT
ps=()
for i in $(seq 0 $((SERVERS - 1))); do
  "$B/ps-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir "$OUT/ps$i" --shard-index "$i" \
    --num-shards "$SERVERS" --tls-dir "$OUT/tls" >"$OUT/ps$i.ready" 2>"$OUT/ps$i.log" &
  pids+=($!)
  for _ in $(seq 1 600); do grep -q ready "$OUT/ps$i.ready" 2>/dev/null && break; sleep 0.1; done
  addr=$(grep -o 'quic=[^ ]*' "$OUT/ps$i.ready" | cut -d= -f2)
  [ -n "$addr" ] || { echo "ps-server $i did not start; see $OUT/ps$i.log" >&2; exit 1; }
  ps+=("$addr")
done

: >"$OUT/grow.tsv"
# shellcheck disable=SC2086
"$B/trainer" train --ps "$(IFS=,; echo "${ps[*]}")" --tls-dir "$OUT/tls" --follow --train "$OUT/grow.tsv" \
  --test "$OUT/test.tsv" --batch-size "$BATCH" --progressive-window "$WINDOW" --progress-secs 1 \
  --checkpoint-dir "$OUT/ckpt" --summary-json "$OUT/summary.json" --metrics-listen 127.0.0.1:0 \
  ${TRAINER_ARGS:-} >"$OUT/summary.txt" 2>"$OUT/trainer.log" &
trainer=$!
pids+=("$trainer")
for _ in $(seq 1 600); do grep -q 'trainer metrics:' "$OUT/trainer.log" 2>/dev/null && break; sleep 0.1; done
metrics=$(grep -o 'http://[^ ]*/metrics' "$OUT/trainer.log" | head -1)
[ -n "$metrics" ] || { echo "trainer did not start; see $OUT/trainer.log" >&2; exit 1; }

python3 - "$OUT/all.tsv" "$OUT/grow.tsv" "$metrics" "$CHUNK" "$INTERVAL" "$ROWS" "$trainer" <<'PY' | tee "$OUT/figure.tsv"
import os, signal, sys, time, urllib.request
src, dst, url, chunk, interval, rows, pid = sys.argv[1:]
chunk, interval, rows, pid = int(chunk), float(interval), int(rows), int(pid)

def scrape():
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    vals = {}
    for line in text.splitlines():
        if line and not line.startswith('#'):
            name, _, v = line.rpartition(' ')
            vals[name] = float(v)
    return (int(vals.get('trainer_samples_total', 0)), vals.get('trainer_progressive_auc'),
            vals.get('trainer_progressive_logloss'))

def row(t, appended):
    trained, auc, ll = scrape()
    fmt = lambda v: 'n/a' if v is None else '%.4f' % v
    print('%.1f\t%d\t%d\t%s\t%s' % (t, appended, trained, fmt(auc), fmt(ll)), flush=True)
    return trained

print('seconds\trows_appended\trows_trained\tprogressive_auc\tprogressive_logloss', flush=True)
start = time.monotonic()
appended = 0
with open(src, 'rb') as inp, open(dst, 'ab') as out:
    while appended < rows:
        lines = [l for _, l in zip(range(chunk), inp)]
        if not lines:
            break
        out.write(b''.join(lines)); out.flush()
        appended += len(lines)
        tick = start + interval * (appended // chunk)
        time.sleep(max(0.0, tick - time.monotonic()))
        row(time.monotonic() - start, appended)
# Every row appended: wait for the trainer to catch up (it may lag), then stop it.
deadline = time.monotonic() + 600
while row(time.monotonic() - start, appended) < appended and time.monotonic() < deadline:
    time.sleep(interval)
time.sleep(1.5)  # one more progress line, so the gauges cover the last rows
row(time.monotonic() - start, appended)
os.kill(pid, signal.SIGTERM)
PY
status=0
wait "$trainer" || status=$?
echo "trainer exited $status after SIGTERM"
grep -E 'stopping|checkpoint at' "$OUT/trainer.log" | tail -3
cat "$OUT/summary.txt"
