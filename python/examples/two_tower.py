"""A custom model on pstrain tables (not DLRM): a two-tower click model.

The user tower pools the user's id, a multi-hot history of items and the categories of those items (mean pooling
over jagged features); the item tower embeds the candidate item and its category. One table can serve several
features: the item table serves the candidate and the history, the category table both category features. The score is the dot product of the two towers' outputs.
Embeddings live on a local cluster of parameter servers (row-wise Adagrad there); the towers are plain PyTorch
with Adam. The data is synthetic with a planted preference (users like items of their own "taste" category), so
the test AUC shows whether anything was learned.

Usage: python two_tower.py [--steps 300] [--batch 512] [--servers 2] [--staleness 1]
"""

import argparse

import numpy as np
import torch
import torch.nn as nn

import pstrain
from pstrain.demo import exact_auc
from pstrain.torch import EmbeddingCollection, EmbeddingTable, JaggedFeatures

USERS, ITEMS, CATS, DIM = 5000, 2000, 20, 16


def batch(rng, n, taste, item_cat):
    users = rng.integers(0, USERS, n)
    # Half the candidates come from the user's taste category (as a retrieval stage would propose them).
    by_cat = [np.flatnonzero(item_cat == c) for c in range(CATS)]
    items = np.where(rng.random(n) < 0.5, [rng.choice(by_cat[taste[u]]) for u in users], rng.integers(0, ITEMS, n))
    lengths = rng.integers(0, 6, n)  # history of 0..5 items, some empty
    history = [rng.choice(by_cat[taste[u]], k) if k else np.zeros(0, np.int64)
               for u, k in zip(users, lengths)]
    like = item_cat[items] == taste[users]
    labels = (rng.random(n) < np.where(like, 0.7, 0.1)).astype(np.float32)
    hist = np.concatenate(history).astype(np.int64)
    feats = JaggedFeatures(
        ["user", "history", "history_category", "item", "category"],
        np.concatenate([users, hist, item_cat[hist], items, item_cat[items]]),
        np.concatenate([np.ones(n, np.int64), lengths, lengths, np.ones(n, np.int64), np.ones(n, np.int64)]),
    )
    return feats, labels


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = nn.Sequential(nn.Linear(3 * DIM, 64), nn.ReLU(), nn.Linear(64, 32))
        self.item = nn.Sequential(nn.Linear(2 * DIM, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, e):
        u = self.user(torch.cat([e["user"], e["history"], e["history_category"]], dim=1))
        v = self.item(torch.cat([e["item"], e["category"]], dim=1))
        return (u * v).sum(1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--staleness", type=int, default=1)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    taste = rng.integers(0, CATS, USERS)
    item_cat = rng.integers(0, CATS, ITEMS)
    torch.manual_seed(0)
    with pstrain.LocalCluster(a.servers) as cluster:
        client = pstrain.Client(cluster.servers, cluster.tls_dir)
        opts = dict(init="normal", init_scale=0.1)
        emb = EmbeddingCollection(client, [
            EmbeddingTable("users", DIM, features=["user"], optimizer="row_adagrad", lr=0.3, options=opts),
            # One item table serves two features: the candidate and the (mean-pooled) history.
            EmbeddingTable("items", DIM, features=["item", "history"], pooling="mean", optimizer="row_adagrad",
                           lr=0.3, options=opts),
            EmbeddingTable("categories", DIM, features=["category", "history_category"], pooling="mean",
                           optimizer="row_adagrad", lr=0.3, options=opts),
        ], staleness=a.staleness)
        model = TwoTower()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        nxt = batch(rng, a.batch, taste, item_cat)
        for step in range(a.steps):
            feats, y = nxt
            nxt = batch(rng, a.batch, taste, item_cat)
            out = emb(feats)
            emb.prefetch(nxt[0])
            loss = nn.functional.binary_cross_entropy_with_logits(model(out), torch.from_numpy(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
        emb.flush()
        feats, y = batch(np.random.default_rng(1), 20000, taste, item_cat)
        with torch.no_grad():
            scores = model(emb(feats)).double().numpy()
        auc = exact_auc(y, scores)
        s = emb.stats()
        client.close()
    print(f"two-tower: {a.steps} steps of {a.batch}, final train loss {float(loss.detach()):.4f}, test AUC {auc:.4f}; "
          f"pulls {s['pull_calls']}, pushes {s['push_calls']}, waiting {s['layer_wait_seconds']:.2f} s")
    return auc


if __name__ == "__main__":
    main()
