"""Criteo-format TSV lines with multi-hot fields, for the tests of bench/pytorch (the Rust gen-criteo writes
one-hot lines only): label, I1..I13, C1..C26, tab-separated; a multi-hot field holds tokens separated by `|`.

Per feature, a field holds 0 to tokens + 2 tokens (so some are empty and some are truncated), drawn from a
skewed per-feature vocabulary of 8-hex-digit tokens; one-hot features (tokens = 1) hold one token or nothing.
The label is drawn from a logistic model of hidden per-token weights and two dense columns, so a model can learn.

    python multihot_data.py --spec model/specs/dlrm-v2-small.toml --rows 4000 --seed 1 --out train.tsv
"""

import argparse
import math
import random


def _hex(feature, i):
    x = (feature * 0x9E3779B97F4A7C15 + i * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & (2**64 - 1)
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    return f"{(x ^ (x >> 29)) & 0xFFFFFFFF:08x}"


def lines(tokens, rows, seed, vocab=500):
    """`rows` lines for per-column token caps `tokens` (26 ints; 1 = one-hot)."""
    rng = random.Random(seed)
    weight = random.Random(12345)  # the hidden model is the same for every seed (train and test agree)
    w = [[weight.gauss(0, 0.6) for _ in range(vocab)] for _ in range(26)]
    out = []
    for _ in range(rows):
        dense = [rng.randrange(0, 1000) if rng.random() > 0.1 else None for _ in range(13)]
        z = -1.0 + 0.3 * math.log1p(dense[0] or 0) - 0.2 * math.log1p(dense[1] or 0)
        fields = []
        for j, t in enumerate(tokens):
            if t == 1:
                ids = [] if rng.random() < 0.05 else [min(int(rng.paretovariate(1.2)) - 1, vocab - 1)]
            else:
                n = rng.randrange(0, t + 3)
                ids = [min(int(rng.paretovariate(1.2)) - 1, vocab - 1) for _ in range(n)]
            z += sum(w[j][i] for i in ids[:t]) / max(1, len(ids[:t])) * 0.5
            fields.append("|".join(_hex(j, i) for i in ids))
        y = 1 if rng.random() < 1 / (1 + math.exp(-z)) else 0
        out.append("\t".join([str(y)] + ["" if d is None else str(d) for d in dense] + fields))
    return out


def write(path, tokens, rows, seed):
    with open(path, "w") as f:
        for line in lines(tokens, rows, seed):
            f.write(line + "\n")


if __name__ == "__main__":
    import tomllib

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, help="a spec TOML: its features' `tokens` (C1..C26 in column order)")
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    doc = tomllib.load(open(a.spec, "rb"))
    caps = [1] * 26
    for f in doc.get("feature", []):
        caps[int(f["column"][1:]) - 1] = f.get("tokens", doc.get("sparse", {}).get("tokens", 1))
    write(a.out, caps, a.rows, a.seed)
