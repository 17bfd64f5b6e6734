"""A small self-attention sequence recommender (SASRec-like) whose item table lives on pstrain's servers.

Generated user histories with a planted signal: items fall in clusters; each user dwells in one cluster and moves
to another now and then, so the next item is predictable from the recent history. Events carry timestamps and
are split into time windows; the model trains on windows ``0 .. w-1`` and is evaluated on window ``w`` (the
future), then trains on ``w``, and so on: hit-rate@10 of the true next item among 100 candidates (it and 99
random items; chance is 0.10).

The item table is a TorchRec ``EmbeddingConfig`` served by ``pstrain.torchrec.EmbeddingCollection`` (one table
for the history, the target and the negative features: ids deduplicated across them each step); the
encoder is plain PyTorch (positional embedding, self-attention of the latest position over the history). ``--local`` trains the same
model with TorchRec's own in-process ``EmbeddingCollection`` and torch SGD on its rows (the baseline): the
module is a drop-in replacement, and with ``--staleness 0`` the two compute the same numbers.

    python python/examples/sequence.py               # tables on 2 local servers
    python python/examples/sequence.py --local       # the same model, local table
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torchrec
from torchrec import EmbeddingConfig, KeyedJaggedTensor

import pstrain
from pstrain.torchrec import EmbeddingCollection


def generate(users, items, clusters, events, windows, seed):
    """``(user, time, item)`` events sorted by time, and each user's events in time order."""
    rng = np.random.default_rng(seed)
    cluster_of = rng.integers(0, clusters, items)
    members = [np.flatnonzero(cluster_of == c) for c in range(clusters)]
    rows = []
    for u in range(users):
        c = rng.integers(0, clusters)
        t = np.sort(rng.uniform(0, windows, events))
        for ts in t:
            if rng.random() < 0.1:
                c = rng.integers(0, clusters)
            item = rng.choice(members[c]) if rng.random() < 0.85 else rng.integers(0, items)
            rows.append((u, ts, item))
    rows.sort(key=lambda r: r[1])
    return rows


def samples(rows, hist_len):
    """Per event: the user's previous ``hist_len`` items (most recent last), the item, the time."""
    seen = {}
    out = []
    for u, ts, item in rows:
        h = seen.setdefault(u, [])
        if h:
            out.append((h[-hist_len:], item, ts))
        h.append(item)
    return out


class Encoder(nn.Module):
    """Positional embedding + self-attention over the history: the most recent position attends to every item of
    the history (padding masked), then a feed-forward block; the result is the user's state, scored against
    item rows by dot product."""

    def __init__(self, dim, hist_len):
        super().__init__()
        self.pos = nn.Embedding(hist_len, dim)
        nn.init.normal_(self.pos.weight, std=0.01)
        self.attn = nn.MultiheadAttention(dim, num_heads=2, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
        self.hist_len = hist_len

    def forward(self, hist_rows, lengths):
        b, d = len(lengths), hist_rows.shape[1]
        L = self.hist_len
        # Right-align each history: its most recent item at position L-1.
        pos = torch.cat([torch.arange(L - n, L) for n in lengths.tolist()])
        row = torch.repeat_interleave(torch.arange(b), lengths)
        x = hist_rows.new_zeros(b, L, d).index_put((row, pos), hist_rows) + self.pos.weight.unsqueeze(0)
        pad = torch.arange(L).unsqueeze(0) < (L - lengths).unsqueeze(1)
        last = x[:, -1:]
        h, _ = self.attn(last, x, x, key_padding_mask=pad, need_weights=False)
        h = self.norm1(last + h)
        return self.norm2(h + self.ff(h)).squeeze(1)


def kjt(hists, targets, negs):
    lengths = [len(h) for h in hists] + [1] * len(targets) + [np.atleast_1d(n).size for n in negs]
    values = [i for h in hists for i in h] + list(targets) + [i for n in negs for i in np.atleast_1d(n)]
    return KeyedJaggedTensor(keys=["hist", "target", "neg"], values=torch.tensor(values, dtype=torch.int64),
                             lengths=torch.tensor(lengths, dtype=torch.int64))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=3000)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--clusters", type=int, default=40)
    ap.add_argument("--events", type=int, default=40, help="events per user")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--hist", type=int, default=10)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3, help="passes over each window's events")
    ap.add_argument("--emb-lr", type=float, default=20.0, help="sgd on the item rows (a mean loss: rows move "
                    "by lr / batch per sample)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--local", action="store_true", help="TorchRec's in-process EmbeddingCollection instead")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--summary-json")
    a = ap.parse_args(argv)
    torch.manual_seed(a.seed)
    data = samples(generate(a.users, a.items, a.clusters, a.events, a.windows, a.seed), a.hist)
    window = np.array([int(ts) for _, _, ts in data])
    rng = np.random.default_rng(a.seed + 1)
    tables = [EmbeddingConfig(name="item_table", embedding_dim=a.dim, num_embeddings=a.items,
                              feature_names=["hist", "target", "neg"], weight_init_min=-0.1, weight_init_max=0.1)]
    cluster = client = None
    if a.local:
        emb = torchrec.EmbeddingCollection(tables=tables)
        emb_opt = torch.optim.SGD(emb.parameters(), lr=a.emb_lr)
    else:
        cluster = pstrain.LocalCluster(2)
        client = pstrain.Client(cluster.servers, cluster.tls_dir)
        emb = EmbeddingCollection(tables, client, optimizer="sgd", lr=a.emb_lr, staleness=a.staleness,
                                  table_prefix=f"seq{a.seed}_")
        emb_opt = emb.fused_optimizer  # updates happen in backward; step() is a no-op
    enc = Encoder(a.dim, a.hist)
    opt = torch.optim.Adam(enc.parameters(), lr=a.lr)
    bce = nn.BCEWithLogitsLoss()
    results, trained, seconds = [], 0, 0.0

    def train_window(w):
        nonlocal trained, seconds
        idx = np.flatnonzero(window == w)
        start = time.perf_counter()
        nxt = None
        batches = [idx[s : s + a.batch] for _ in range(a.epochs) for s in range(0, len(idx), a.batch)]
        feats = [kjt([data[i][0] for i in bi], [data[i][1] for i in bi], rng.integers(0, a.items, len(bi)))
                 for bi in batches]
        for j, f in enumerate(feats):
            out = emb(f)
            if not a.local and j + 1 < len(feats):
                emb.prefetch(feats[j + 1])
            state = enc(out["hist"].values(), out["hist"].lengths())
            pos = (state * out["target"].values()).sum(1)
            neg = (state * out["neg"].values()).sum(1)
            loss = bce(torch.cat([pos, neg]), torch.cat([torch.ones_like(pos), torch.zeros_like(neg)]))
            opt.zero_grad()
            emb_opt.zero_grad()
            loss.backward()
            opt.step()
            emb_opt.step()
            trained += len(batches[j])
        if not a.local:
            emb.wait()
        seconds += time.perf_counter() - start

    @torch.no_grad()
    def evaluate(w):
        idx = np.flatnonzero(window == w)[:2000]
        hits = 0
        for s in range(0, len(idx), a.batch):
            bi = idx[s : s + a.batch]
            cands = [np.concatenate([[data[i][1]], rng.integers(0, a.items, 99)]) for i in bi]
            out = emb(kjt([data[i][0] for i in bi], [data[i][1] for i in bi], cands))
            state = enc(out["hist"].values(), out["hist"].lengths())
            scores = torch.einsum("bd,bkd->bk", state, out["neg"].values().view(len(bi), 100, -1))
            rank = (scores[:, 1:] > scores[:, :1]).sum(1)
            hits += int((rank < 10).sum())
        return hits / max(1, len(idx))

    try:
        train_window(0)
        for w in range(1, a.windows):
            hr = evaluate(w)
            results.append(dict(window=w, hit_rate_at_10=hr))
            print(f"window {w}: hit-rate@10 {hr:.3f} (trained on windows < {w})", flush=True)
            train_window(w)
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.stop()
    summary = dict(mode="local torchrec.EmbeddingCollection" if a.local else f"pstrain K={a.staleness}",
                   windows=results, samples=trained, seconds=seconds, samples_per_sec=trained / seconds)
    print(json.dumps(summary))
    if a.summary_json:
        with open(a.summary_json, "w") as f:
            json.dump(summary, f, indent=2)
    return summary


if __name__ == "__main__":
    main()
