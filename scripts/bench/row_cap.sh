#!/usr/bin/env bash
# Issue 43's eviction figure: test AUC and samples/s of `trainer demo` (2 local servers) with every table capped at
# FRACTION (default 50%) of its distinct training ids by the LFU cap (`eviction` in the model spec), against TTL
# expiry (`ps-server --row-ttl-secs`) and against no eviction, on the same generated data (Zipf-like ids).
# The cap is per server: a table of D distinct ids gets `max_rows = ceil(D * FRACTION / servers)`; tables of fewer
# than MIN_TABLE_IDS distinct ids (default 1000) are not capped (a cap of a few rows on a table of a few hot ids
# would delete hot rows every pass; their rows are a negligible share of the total). Expiry passes
# run every second (`--expire-interval-secs 1`) in the capped and TTL runs. Prints a table, and the rows each
# run deleted (from the servers' logs).
#
# Usage: scripts/bench/row_cap.sh [OUT_DIR]
#   env: ROWS (1000000), TEST_ROWS (100000), FRACTION (0.5), DECAY_SECS (10), TTL_SECS ("2 5"), MIN_TABLE_IDS (1000),
#        CARGO_TARGET_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /tmp/row-cap.XXXXXX)}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
ROWS=${ROWS:-1000000} TEST_ROWS=${TEST_ROWS:-100000} FRACTION=${FRACTION:-0.5} DECAY_SECS=${DECAY_SECS:-10}
TTL_SECS=${TTL_SECS-2 5} MIN_TABLE_IDS=${MIN_TABLE_IDS:-1000}
B=${CARGO_TARGET_DIR:-target}/release
[ -x "$B/trainer" ] && [ -x "$B/gen-criteo" ] || cargo build --release -p trainer -p bench --bins
train=$OUT/train.tsv test=$OUT/test.tsv
[ -s "$train" ] || "$B/gen-criteo" --rows "$ROWS" --seed 1 --teacher-seed 7 --out "$train" 2>/dev/null
[ -s "$test" ] || "$B/gen-criteo" --rows "$TEST_ROWS" --seed 2 --teacher-seed 7 --out "$test" 2>/dev/null

# The flags' DLRM as a spec, without and with a cap per table.
python3 - "$train" "$OUT" "$FRACTION" "$DECAY_SECS" "$MIN_TABLE_IDS" <<'PY'
import math, sys
train, out, fraction, decay, min_ids = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
distinct = [set() for _ in range(26)]
with open(train) as f:
    for line in f:
        cols = line.rstrip("\n").split("\t")
        cols += [""] * (40 - len(cols))
        for k in range(26):
            distinct[k].add(cols[14 + k])
head = 'name = "flags"\nbottom_mlp = [512, 256, 64, 16]\ntop_mlp = [512, 256, 1]\n[sparse]\ndim = 16\n'
for name, cap in (("none", False), ("lfu", True)):
    text = head
    for k in range(26):
        text += f'[[feature]]\ncolumn = "C{k + 1}"\ntable = "C{k + 1}"\n'
        if cap and len(distinct[k]) >= min_ids:
            rows = max(1, math.ceil(len(distinct[k]) * fraction / 2))
            text += f'eviction = {{ policy = "lfu", max_rows = {rows}, decay_secs = {decay} }}\n'
    open(f"{out}/{name}.toml", "w").write(text)
total = sum(len(d) for d in distinct)
kept = sum(math.ceil(len(d) * fraction) if len(d) >= min_ids else len(d) for d in distinct)
print(f"distinct ids over the 26 tables: {total:,}; capped: {kept:,} rows ({kept / total:.1%})", file=sys.stderr)
PY

run() { # name, extra demo args...
    local name=$1
    shift
    echo "== $name" >&2
    rm -rf "$OUT/run-$name"
    "$B/trainer" demo --data-dir "$OUT/run-$name" --train "$train" --test "$test" \
        --summary-json "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
}
run none --model-spec "$OUT/none.toml"
run lfu --model-spec "$OUT/lfu.toml" --server-arg=--expire-interval-secs --server-arg=1
for t in $TTL_SECS; do
    run "ttl-$t" --model-spec "$OUT/none.toml" --server-arg=--expire-interval-secs --server-arg=1 \
        --server-arg=--row-ttl-secs --server-arg="$t"
done

python3 - "$OUT" $TTL_SECS <<'PY'
import glob, json, re, sys
out, ttls = sys.argv[1], sys.argv[2:]
def deleted(name, what):
    n = 0
    for log in glob.glob(f"{out}/run-{name}/run/ps-*.log"):
        for line in open(log, errors="replace"):
            if what in line:
                m = re.search(r"deleted=(\d+)", line)
                n += int(m.group(1)) if m else 0
    return n
print("| run | test AUC | vs none | samples/s | rows deleted |")
print("| --- | --- | --- | --- | --- |")
base = json.load(open(f"{out}/none.json"))
for name in ["none", "lfu"] + [f"ttl-{t}" for t in ttls]:
    r = json.load(open(f"{out}/{name}.json"))
    gone = deleted(name, "past their tables' caps") + deleted(name, "expired rows past their TTL")
    print(f"| {name} | {r['auc']:.4f} | {r['auc'] - base['auc']:+.4f} | {r['samples_per_sec']:,.0f} | {gone:,} |")
PY
