"""Criteo-format TSV for a model spec: per-table rows and EmbeddingBag bags (docs/model-spec.md, "Semantics").

Tokens are Criteo's hex values (1 to 8 hex digits). A token t of a feature whose table has hash_size h > 0 becomes
t % h, then one row per distinct (table, value) pair: features sharing a table share its rows, as the trainer's
feature_id(T, t % h). Rows are created for every pair seen in the train or test file (as dlrm_reference.py does
without a spec); rows only the test file uses are never trained, as on the parameter servers.

One-hot features (tokens = 1): an empty field is a token of its own (the "missing" row, never hashed); a `|` list
keeps its first token and the rest count as truncated. Multi-hot features (tokens > 1): the field's tokens are split
by `|`; an empty field is an empty bag (pools to zeros); empty pieces (`a||b`) are skipped; more than `tokens`
tokens keep the first `tokens` and the rest count as truncated.

Embedding weights are grouped: tables with the same (dim, optimizer, lr) are concatenated into one weight (one
nn.EmbeddingBag, one optimizer), and each group's features with the same pooling are looked up by one
embedding_bag call whose bags are ordered (sample, feature). With one table per column, one-hot, dim 16 and one
optimizer (the dlrm-kaggle spec) that is exactly the concatenated table of the run without a spec.
"""

import math
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from .spec import NUM_DENSE, NUM_SPARSE

MISSING = -1  # the key of a one-hot feature's empty field (token values are >= 0)


@dataclass
class Group:
    dim: int
    optimizer: str
    lr: float
    tables: list = field(default_factory=list)  # table indices, in order of first appearance


@dataclass
class Call:
    group: int
    mode: str  # sum | mean
    features: list = field(default_factory=list)  # feature indices, in spec order


class Layout:
    """How a spec's tables map to weights (groups) and its features to embedding_bag calls."""

    def __init__(self, spec):
        self.spec = spec
        self.groups, self.calls = [], []
        self.table_group = []
        gkeys, ckeys = {}, {}
        for t in spec.tables:
            key = (t.dim, t.optimizer, t.lr)
            if key not in gkeys:
                gkeys[key] = len(self.groups)
                self.groups.append(Group(t.dim, t.optimizer, t.lr))
            self.groups[gkeys[key]].tables.append(t.index)
            self.table_group.append(gkeys[key])
        table_index = {t.name: t.index for t in spec.tables}
        self.feature_table = [table_index[f.table] for f in spec.features]
        for f in spec.features:
            g = self.table_group[self.feature_table[f.index]]
            key = (g, f.pooling)
            if key not in ckeys:
                ckeys[key] = len(self.calls)
                self.calls.append(Call(g, f.pooling))
            self.calls[ckeys[key]].features.append(f.index)

    def table_offsets(self, table_rows):
        """Each table's first row inside its group's weight, and each group's row count."""
        offsets = [0] * len(table_rows)
        group_rows = []
        for g in self.groups:
            n = 0
            for t in g.tables:
                offsets[t] = n
                n += table_rows[t]
            group_rows.append(max(n, 1))  # a weight needs a row even if no token was ever seen
        return offsets, group_rows


class Bags:
    """One file's sparse input: per embedding_bag call, the flat row indices and the bag starts ((sample, feature)
    order, n * features + 1 of them)."""

    def __init__(self, idx, starts, widths):
        self.idx = [torch.from_numpy(i) for i in idx]
        self.starts = [torch.from_numpy(s) for s in starts]
        self.widths = widths  # features per call

    def batch(self, s, e):
        """The (indices, offsets) per call of samples s..e."""
        out = []
        for idx, starts, w in zip(self.idx, self.starts, self.widths):
            b = starts[s * w : e * w + 1]
            b0 = b[0]
            out.append((idx[b0 : b[-1]], b[:-1] - b0))
        return out


class RawFile:
    """A parsed file before the row offsets are known (the test file may add rows)."""

    def __init__(self, labels, dense, rows, lengths, truncated, bad):
        self.labels, self.dense, self.rows, self.lengths = labels, dense, rows, lengths
        self.truncated, self.bad = truncated, bad


def _token(text):
    if len(text) > 8:
        raise ValueError(f"{text!r} has more than 8 hex digits")
    return int(text, 16)


def parse_file(path, layout, vocabs):
    """Reads a Criteo TSV (label, I1..I13, C1..C26; missing trailing fields are empty) for `layout`'s spec.

    `vocabs` (one dict per table: key -> row) is extended in place. Lines with a non-integer label or I column or
    a non-hex token are skipped (and counted)."""
    spec = layout.spec
    feats = spec.features
    per_call = []
    for c in layout.calls:
        per_call.append([(1 + NUM_DENSE + feats[f].column, feats[f].tokens, feats[f].hash_size,
                          vocabs[layout.feature_table[f]]) for f in c.features])
    rows = [[] for _ in layout.calls]
    lengths = [[] for _ in layout.calls]
    truncated = [0] * len(feats)
    call_truncated = [[f for f in c.features] for c in layout.calls]
    labels, dense = [], []
    bad = 0
    width = 1 + NUM_DENSE + NUM_SPARSE
    with open(path, "r", encoding="ascii", newline="") as fh:
        for line in fh:
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) < width:
                fields += [""] * (width - len(fields))
            try:
                y = int(fields[0])
                d = [math.log1p(max(int(x), 0)) if x else 0.0 for x in fields[1 : 1 + NUM_DENSE]]
                keys = []  # per call, per feature: the bag's keys
                cut = []
                for ci, spec_feats in enumerate(per_call):
                    ck = []
                    for k, (fi, tokens, h, _) in enumerate(spec_feats):
                        text = fields[fi]
                        if "|" in text and "" in text.split("|"):
                            # an empty token (a||b, a leading or trailing |) makes the line malformed, as in
                            # the trainer's parser (criteo/src/parse.rs, ParseError::EmptyToken)
                            raise ValueError(f"C{fi - NUM_DENSE}: empty token in {text!r}")
                        if tokens == 1:
                            if "|" in text:
                                pieces = text.split("|")
                                cut.append((ci, k, len(pieces) - 1))
                                text = pieces[0]
                            if text:
                                t = _token(text)
                                ck.append([t % h if h else t])
                            else:
                                ck.append([MISSING])
                        elif text:
                            pieces = text.split("|")
                            if len(pieces) > tokens:
                                cut.append((ci, k, len(pieces) - tokens))
                                pieces = pieces[:tokens]
                            ts = [_token(p) for p in pieces]
                            ck.append([t % h for t in ts] if h else ts)
                        else:
                            ck.append([])
                    keys.append(ck)
            except ValueError:
                bad += 1
                continue
            for ci, ck in enumerate(keys):
                r, ln = rows[ci], lengths[ci]
                for (_, _, _, v), bag in zip(per_call[ci], ck):
                    for key in bag:
                        idx = v.get(key)
                        if idx is None:
                            idx = len(v)
                            v[key] = idx
                        r.append(idx)
                    ln.append(len(bag))
            for ci, k, n in cut:
                truncated[call_truncated[ci][k]] += n
            labels.append(y)
            dense.append(d)
    if bad:
        print(f"{path}: skipped {bad} malformed lines", file=sys.stderr)
    return RawFile(np.asarray(labels, dtype=np.float32), np.asarray(dense, dtype=np.float32).reshape(-1, NUM_DENSE),
                   rows, lengths, truncated, bad)


def finalize(raw, layout, table_offsets):
    """The file's Bags once every table's row count (and so its offset in its group's weight) is known."""
    idx_out, starts_out, widths = [], [], []
    for ci, c in enumerate(layout.calls):
        w = len(c.features)
        lengths = np.asarray(raw.lengths[ci], dtype=np.int64)
        starts = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        local = np.asarray(raw.rows[ci], dtype=np.int64)
        feat_off = np.asarray([table_offsets[layout.feature_table[f]] for f in c.features], dtype=np.int64)
        bag_off = np.tile(feat_off, len(lengths) // w if w else 0)
        idx_out.append(local + np.repeat(bag_off, lengths))
        starts_out.append(starts)
        widths.append(w)
    return Bags(idx_out, starts_out, widths)


def load(train_path, test_path, layout):
    """Parses both files; returns (train RawFile, train Bags, test RawFile, test Bags, group row counts)."""
    vocabs = [dict() for _ in layout.spec.tables]
    tr = parse_file(train_path, layout, vocabs)
    te = parse_file(test_path, layout, vocabs)
    offsets, group_rows = layout.table_offsets([len(v) for v in vocabs])
    return tr, finalize(tr, layout, offsets), te, finalize(te, layout, offsets), group_rows
