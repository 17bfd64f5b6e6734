#!/usr/bin/env bash
# Trains the same DLRM on the same generated Criteo data twice, one run after the other on the same cores:
#   ours:    `trainer demo` (two ps-server processes on loopback; every embedding row is pulled and pushed over QUIC)
#   pytorch: bench/pytorch/dlrm_reference.py (everything in one process, embeddings in local memory)
# for each optimizer setting (default: "sgd adagrad"), and prints samples/s, test AUC and logloss side by side.
#
# Usage: scripts/bench/pytorch_compare.sh [OUT_DIR]
#   env: ROWS (training rows, default 1000000), TEST_ROWS (100000), OPTIMIZERS ("sgd adagrad"),
#        THREADS (PyTorch threads, default 2), PYTHON (an interpreter with torch and numpy; default python3),
#        TRAINER_ARGS (extra flags for `trainer demo`, e.g. "--dense-precision bf16"),
#        PYTORCH_ARGS (extra flags for dlrm_reference.py, e.g. "--bf16"),
#        OURS_INPUT (columnar, the default: ours reads `trainer preprocess` shards, as PyTorch parses before timing;
#        or tsv), REPEAT (rounds, default 1: each round runs ours then PyTorch for every optimizer, so the two
#        alternate and a drift of the host's speed hits both; the summary gives each round's ratio and the median)
#
# PyTorch is optional. Without it the script says how to install it and exits 0 ("skipped"):
#   python3 -m venv /var/tmp/torch-venv && /var/tmp/torch-venv/bin/pip install torch numpy
#   PYTHON=/var/tmp/torch-venv/bin/python scripts/bench/pytorch_compare.sh
set -euo pipefail
SPEC_ARGS=()
if [ -n "${MODEL_SPEC:-}" ]; then
    if [ -n "${OPTIMIZERS:-}" ]; then
        echo "MODEL_SPEC sets the optimizers (per table and [dense]): leave OPTIMIZERS unset" >&2
        exit 2
    fi
    [ -f "$MODEL_SPEC" ] && MODEL_SPEC=$(realpath "$MODEL_SPEC")  # a path relative to the caller, before the cd
    SPEC_ARGS=(--model-spec "$MODEL_SPEC")
    OPTIMIZERS=spec
fi
[ -n "${DATA:-}" ] && [ -d "$DATA" ] && DATA=$(realpath "$DATA")
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
    echo "skipped: $PY cannot import torch and numpy." >&2
    echo "  install: python3 -m venv /var/tmp/torch-venv && /var/tmp/torch-venv/bin/pip install torch numpy" >&2
    echo "  then:    PYTHON=/var/tmp/torch-venv/bin/python $0" >&2
    echo "pytorch comparison skipped (no torch)"
    exit 0
fi
OUT=${1:-$(mktemp -d /tmp/compare-pytorch.XXXXXX)}
mkdir -p "$OUT"
ROWS=${ROWS:-1000000}
TEST_ROWS=${TEST_ROWS:-100000}
if [ -z "${DATA:-}" ]; then
    DATA=data/demo
    [ -n "${MODEL_SPEC:-}" ] && DATA="data/demo/spec-$(basename "$MODEL_SPEC" .toml)"
fi
mkdir -p "$DATA"
cargo build --release -q -p trainer -p ps-server -p bench --bins
B=${CARGO_TARGET_DIR:-target}/release
# The demo names its generated files train-ROWS-s1-t7[-mhHASH].tsv (the tag for a multi-hot spec's bag sizes).
data_file() { ls "$DATA"/$1-s$2-t7*.tsv 2>/dev/null | head -1 || true; }
TRAIN_TSV=$(data_file "train-$ROWS" 1)
TEST_TSV=$(data_file "test-$TEST_ROWS" 2)
if [ -z "$TRAIN_TSV" ] || [ -z "$TEST_TSV" ]; then
    echo "== generating the data (a one-step demo run)" >&2
    $B/trainer demo --rows "$ROWS" --test-rows "$TEST_ROWS" --data-dir "$DATA" --max-steps 1 "${SPEC_ARGS[@]}" >&2
    TRAIN_TSV=$(data_file "train-$ROWS" 1)
    TEST_TSV=$(data_file "test-$TEST_ROWS" 2)
fi
# PyTorch parses the whole training file before its timed loop. To time the same thing, ours trains on the
# columnar shards of `trainer preprocess` (read memory-mapped; same rows, same order), made once here and not
# timed. OURS_INPUT=tsv trains on the text file instead, parsing inside the timed run.
TRAIN="$TRAIN_TSV"
if [ "${OURS_INPUT:-columnar}" != tsv ]; then
    TRAIN="${TRAIN_TSV%.tsv}.cols"
    if [ ! -d "$TRAIN" ]; then
        $B/trainer preprocess --input "$TRAIN_TSV" --out "$TRAIN" "${SPEC_ARGS[@]}" >&2
    fi
fi
REPEAT=${REPEAT:-1}
for r in $(seq 1 "$REPEAT"); do
    for opt in ${OPTIMIZERS:-sgd adagrad}; do
        # with a spec: --model-spec instead of --optimizer (the spec sets each table's optimizer and the dense one)
        if [ "$opt" = spec ]; then MODEL_ARGS=("${SPEC_ARGS[@]}"); else MODEL_ARGS=(--optimizer "$opt"); fi
        echo "== round $r of $REPEAT: ours, ${MODEL_ARGS[*]}" >&2
        $B/trainer demo --data-dir "$DATA" --train "$TRAIN" --test "$TEST_TSV" "${MODEL_ARGS[@]}" \
            --summary-json "$OUT/ours-$opt-$r.json" ${TRAINER_ARGS:-} >&2
        echo "== round $r of $REPEAT: pytorch, ${MODEL_ARGS[*]}" >&2
        "$PY" bench/pytorch/dlrm_reference.py --train "$TRAIN_TSV" --test "$TEST_TSV" "${MODEL_ARGS[@]}" \
            --threads "${THREADS:-2}" --json "$OUT/pytorch-$opt-$r.json" ${PYTORCH_ARGS:-} >&2
    done
done
python3 - "$OUT" "$REPEAT" ${OPTIMIZERS:-sgd adagrad} <<'PY'
import json, os, statistics, sys
out, repeat, opts = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"\nresults in {out}")
if os.environ.get("MODEL_SPEC"):
    print(f"model spec: {os.environ['MODEL_SPEC']}")
print(f"ours: trainer demo {os.environ.get('TRAINER_ARGS', '')} ({os.environ.get('OURS_INPUT', 'columnar')} input); "
      f"pytorch: dlrm_reference.py {os.environ.get('PYTORCH_ARGS', '')}; {repeat} round(s), ours and pytorch alternating")
print("| optimizer (emb / dense) | round | ours samples/s | pytorch samples/s | ratio | ours AUC | pytorch AUC | AUC diff | ours logloss | pytorch logloss |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
summary = []
for o in opts:
    ratios = []
    for r in range(1, repeat + 1):
        a = json.load(open(os.path.join(out, f"ours-{o}-{r}.json")))
        p = json.load(open(os.path.join(out, f"pytorch-{o}-{r}.json")))
        dense = p["dense_optimizer"]
        if o == "spec":
            o_label = f"{p.get('model_spec', 'spec')}: {p['optimizer']}"
        else:
            o_label = o
        ratio = a["samples_per_sec"] / p["samples_per_sec"]
        ratios.append(ratio)
        print(f"| {o_label} / {dense} | {r} | {a['samples_per_sec']:,.0f} | {p['samples_per_sec']:,.0f} | "
              f"{ratio:.2f}x | {a['auc']:.4f} | {p['auc']:.4f} | "
              f"{a['auc'] - p['auc']:+.4f} | {a['logloss']:.4f} | {p['logloss']:.4f} |")
    summary.append(f"{o}: median ratio {statistics.median(ratios):.2f}x over {repeat} round(s) "
                   f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")
print("\n".join(summary))
PY
