#!/usr/bin/env bash
# Issue 43's row-precision figures: test AUC and samples/s of `trainer demo` with the servers' rows stored as
# f32, bf16 and f16 (`--row-precision`), same data and seeds, the precisions interleaved within each data set:
#   demo      the 1M-row demo data (generator teacher 7), the flags' DLRM;
#   teacher11 data of another planted click model (`gen-criteo --teacher-seed 11`), the flags' DLRM;
#   dlrm-v2   the dlrm-v2 spec (multi-hot, dim 128, DCNv2) on its generated data, bf16 dense products.
# Prints one line per run and a table of AUC differences against f32 (goal: within 0.001).
#
# Usage: scripts/bench/row_precision.sh [OUT_DIR]
#   env: ROWS (1000000), TEST_ROWS (100000), V2_ROWS (200000), V2_TEST_ROWS (20000), SETS ("demo teacher11 dlrm-v2"),
#        PRECISIONS ("f32 bf16 f16"), CARGO_TARGET_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /tmp/row-precision.XXXXXX)}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
ROWS=${ROWS:-1000000} TEST_ROWS=${TEST_ROWS:-100000}
V2_ROWS=${V2_ROWS:-200000} V2_TEST_ROWS=${V2_TEST_ROWS:-20000}
SETS=${SETS:-demo teacher11 dlrm-v2}
PRECISIONS=${PRECISIONS:-f32 bf16 f16}
B=${CARGO_TARGET_DIR:-target}/release
[ -x "$B/trainer" ] && [ -x "$B/gen-criteo" ] || cargo build --release -p trainer -p bench --bins

for set in $SETS; do
    case $set in
    demo | teacher11)
        teacher=7
        [ "$set" = teacher11 ] && teacher=11
        train=$OUT/data-$set/train.tsv test=$OUT/data-$set/test.tsv
        mkdir -p "$OUT/data-$set"
        [ -s "$train" ] || "$B/gen-criteo" --rows "$ROWS" --seed 1 --teacher-seed $teacher --out "$train" 2>/dev/null
        [ -s "$test" ] || "$B/gen-criteo" --rows "$TEST_ROWS" --seed 2 --teacher-seed $teacher --out "$test" 2>/dev/null
        args=(--train "$train" --test "$test")
        ;;
    dlrm-v2)
        args=(--model-spec dlrm-v2 --rows "$V2_ROWS" --test-rows "$V2_TEST_ROWS" --dense-precision bf16)
        ;;
    *) echo "unknown set $set" >&2; exit 2 ;;
    esac
    for p in $PRECISIONS; do
        echo "== $set, $p rows" >&2
        "$B/trainer" demo --data-dir "$OUT/run-$set" "${args[@]}" --row-precision "$p" \
            --summary-json "$OUT/$set-$p.json" > "$OUT/$set-$p.log" 2>&1
    done
done

python3 - "$OUT" "$SETS" "$PRECISIONS" <<'PY'
import json, sys
out, sets, precisions = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
print("| data | rows | test AUC | vs f32 | logloss | samples/s |")
print("| --- | --- | --- | --- | --- | --- |")
for s in sets:
    base = json.load(open(f"{out}/{s}-f32.json")) if "f32" in precisions else None
    for p in precisions:
        r = json.load(open(f"{out}/{s}-{p}.json"))
        d = f"{r['auc'] - base['auc']:+.4f}" if base else "-"
        print(f"| {s} | {p} | {r['auc']:.4f} | {d} | {r['logloss']:.4f} | {r['samples_per_sec']:,.0f} |")
PY
