#!/usr/bin/env bash
# The DLRM-v2 figures of issue 20 (bench/figures/history.md, "Sixteenth round"), one after the other on the same cores:
#   1. ours vs PyTorch on the dlrm-v2 spec (model/specs/dlrm-v2.toml), generated multi-hot data, both in bf16
#      (scripts/bench/pytorch_compare.sh with MODEL_SPEC=dlrm-v2): samples/s, AUC, and ours' wire bytes per sample (f16);
#   2. ours with int8 pushes (error feedback on, f16 pulls): wire bytes per sample and AUC against 1;
#   3. ours with the dot interaction instead of DCNv2 (dlrm-v2 with [interaction] kind = "dot"): AUC against 1.
#
# Usage: scripts/bench/dlrm_v2.sh [OUT_DIR]
#   env: ROWS (default 1000000), TEST_ROWS (100000), PYTHON (with torch and numpy), PRECISION (bf16 or f32)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-$(mktemp -d /tmp/dlrm-v2.XXXXXX)}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
export ROWS=${ROWS:-1000000} TEST_ROWS=${TEST_ROWS:-100000}
PRECISION=${PRECISION:-bf16}
if [ "$PRECISION" = bf16 ]; then
    export TRAINER_ARGS="--dense-precision bf16" PYTORCH_ARGS="--bf16"
else
    export TRAINER_ARGS="--dense-precision f32" PYTORCH_ARGS=""
fi
export MODEL_SPEC=dlrm-v2 DATA=${DATA:-data/demo/spec-dlrm-v2}
scripts/bench/pytorch_compare.sh "$OUT/compare" | tee "$OUT/compare.txt"
B=${CARGO_TARGET_DIR:-target}/release
TRAIN=$(ls -d "$DATA"/train-$ROWS-s1-t7*.cols | head -1)
TEST=$(ls "$DATA"/test-$TEST_ROWS-s2-t7*.tsv | head -1)
sed -e 's/^name = "dlrm-v2"/name = "dlrm-v2-dot"/' -e 's/^kind = "dcn"/kind = "dot"/' -e '/^layers = /d' \
    -e '/^rank = /d' model/specs/dlrm-v2.toml > "$OUT/dlrm-v2-dot.toml"
# (a spec sets the tables' encodings: the encoding flags do not apply)
sed -e 's/^name = "dlrm-v2"/name = "dlrm-v2-int8"/' -e 's|^encoding = "f16"|encoding = "f16/int8"|' \
    model/specs/dlrm-v2.toml > "$OUT/dlrm-v2-int8.toml"
echo "== ours, int8 pushes with error feedback" >&2
$B/trainer demo --data-dir "$DATA" --train "$TRAIN" --test "$TEST" --model-spec "$OUT/dlrm-v2-int8.toml" \
    $TRAINER_ARGS --summary-json "$OUT/ours-int8.json" >&2
echo "== ours, dot interaction" >&2
$B/trainer demo --data-dir "$DATA" --train "$TRAIN" --test "$TEST" --model-spec "$OUT/dlrm-v2-dot.toml" \
    $TRAINER_ARGS --summary-json "$OUT/ours-dot.json" >&2
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
load = lambda name: json.load(open(f"{out}/{name}"))
rows = [("dcn, f16 (compare round 1)", load("compare/ours-spec-1.json")),
        ("dcn, f16 pulls + int8 pushes + error feedback", load("ours-int8.json")),
        ("dot, f16", load("ours-dot.json"))]
print("| ours, dlrm-v2 | samples/s | AUC | logloss | wire bytes/sample |")
print("| --- | --- | --- | --- | --- |")
for name, s in rows:
    print(f"| {name} | {s['samples_per_sec']:.0f} | {s['auc']:.5f} | {s['logloss']:.5f} | "
          f"{s['wire_bytes'] / max(s['samples'], 1):.0f} |")
PY
