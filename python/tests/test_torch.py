"""The PyTorch layer against local torch tables: same rows, same gradients, same weights after training."""

import numpy as np
import pytest
import torch
import torch.nn as nn

import pstrain
from pstrain.torch import EmbeddingCollection, EmbeddingTable, JaggedFeatures

DIM = 4
LR = 0.1


def random_batches(rng, steps, batch, keys, vocab, max_len):
    out = []
    for _ in range(steps):
        lists = {k: [list(rng.integers(0, vocab, rng.integers(0 if max_len > 1 else 1, max_len + 1)))
                     for _ in range(batch)] for k in keys}
        out.append(lists)
    return out


class Tower(nn.Module):
    """A small dense model over the pooled features (any torch module works)."""

    def __init__(self, n_features):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(n_features * DIM, 1)

    def forward(self, pooled):
        return self.lin(torch.cat(pooled, dim=1)).squeeze(1)


def train_both(client, name, pooling, batches, keys, labels, prefetch=None, staleness=0):
    """Trains the PS model and a local nn.EmbeddingBag model from the same rows; returns both."""
    coll = EmbeddingCollection(
        client, [EmbeddingTable(name, DIM, features=keys, pooling=pooling, optimizer="sgd", lr=LR,
                                options=dict(init="uniform", init_scale=0.3, seed=11))], staleness=staleness)
    vocab = 1 + max(max(max(s, default=0) for s in b[k]) for b in batches for k in keys)
    init = client.pull(name, np.arange(vocab, dtype=np.int64))
    local = nn.EmbeddingBag(vocab, DIM, mode="sum" if pooling == "none" else pooling)
    with torch.no_grad():
        local.weight.copy_(torch.from_numpy(init))
    tower_ps, tower_local = Tower(len(keys)), Tower(len(keys))
    opt_ps = torch.optim.SGD(tower_ps.parameters(), lr=LR)
    opt_local = torch.optim.SGD(list(tower_local.parameters()) + [local.weight], lr=LR)
    feats = [JaggedFeatures.from_lists(b) for b in batches]
    grads = []
    for step, (f, y) in enumerate(zip(feats, labels)):
        if prefetch == "before" and step + 1 < len(feats):
            coll.prefetch(feats[step + 1])  # issued before this batch's forward, which uses its own prefetch
        out = coll(f)
        if prefetch == "after" and step + 1 < len(feats):
            coll.prefetch(feats[step + 1])
        if pooling == "none":
            pooled_ps = []
            for k in keys:
                _, lengths = f.key(k)
                seg = torch.repeat_interleave(torch.arange(len(lengths)), torch.from_numpy(lengths))
                pooled_ps.append(torch.zeros(len(lengths), DIM).index_add(0, seg, out[k]))
        else:
            pooled_ps = [out[k] for k in keys]
        pooled_local = []
        for k in keys:
            values, lengths = f.key(k)
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
            pooled_local.append(local(torch.from_numpy(values.astype(np.int64)), offsets))
        yt = torch.from_numpy(y)
        loss_ps = nn.functional.binary_cross_entropy_with_logits(tower_ps(pooled_ps), yt)
        loss_local = nn.functional.binary_cross_entropy_with_logits(tower_local(pooled_local), yt)
        opt_ps.zero_grad()
        opt_local.zero_grad()
        loss_ps.backward()
        loss_local.backward()
        grads.append((tower_ps.lin.weight.grad.clone(), tower_local.lin.weight.grad.clone()))
        opt_ps.step()
        opt_local.step()
    coll.flush()
    final = client.pull(name, np.arange(vocab, dtype=np.int64))
    return final, local.weight.detach().numpy(), grads, tower_ps, tower_local


@pytest.mark.parametrize("pooling", ["sum", "mean", "none"])
def test_training_equals_local_embedding_bag_at_staleness_0(client, table_name, pooling):
    rng = np.random.default_rng(5)
    keys = ["a", "b"]
    batches = random_batches(rng, 6, 8, keys, 30, 3)
    labels = [rng.integers(0, 2, 8).astype(np.float32) for _ in batches]
    ps, local, grads, tp, tl = train_both(client, table_name, pooling, batches, keys, labels)
    for g_ps, g_local in grads:
        torch.testing.assert_close(g_ps, g_local, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ps, local, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tp.lin.weight, tl.lin.weight, rtol=1e-5, atol=1e-6)
    assert np.abs(ps - local).max() < 1e-5 and np.abs(ps).max() > 0


def test_one_hot_equals_local_embedding(client, table_name):
    rng = np.random.default_rng(9)
    keys = ["u"]
    batches = random_batches(rng, 5, 16, keys, 12, 1)
    labels = [rng.integers(0, 2, 16).astype(np.float32) for _ in batches]
    ps, local, _, _, _ = train_both(client, table_name, "sum", batches, keys, labels)
    np.testing.assert_allclose(ps, local, rtol=1e-5, atol=1e-6)


def test_prefetch_gives_identical_results_at_staleness_0(client, table_name):
    rng = np.random.default_rng(6)
    keys = ["a", "b"]
    batches = random_batches(rng, 8, 8, keys, 10, 3)  # a small vocabulary: consecutive batches share ids
    labels = [rng.integers(0, 2, 8).astype(np.float32) for _ in batches]
    plain, _, _, tp_plain, _ = train_both(client, table_name + "p0", "sum", batches, keys, labels)
    fetched, local, _, tp_fetch, _ = train_both(client, table_name + "p1", "sum", batches, keys, labels,
                                                prefetch="after")
    early, _, _, _, _ = train_both(client, table_name + "p2", "sum", batches, keys, labels, prefetch="before")
    np.testing.assert_array_equal(plain, fetched)
    np.testing.assert_array_equal(plain, early)
    np.testing.assert_allclose(fetched, local, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tp_plain.lin.weight, tp_fetch.lin.weight, rtol=0, atol=0)


def test_staleness_bounds_pushes_in_flight(client, table_name):
    coll = EmbeddingCollection(client, [EmbeddingTable(table_name, DIM, optimizer="sgd", lr=LR)], staleness=2)
    f = JaggedFeatures.from_dense([table_name], np.arange(6, dtype=np.int64).reshape(6, 1))
    for _ in range(5):
        coll(f)[table_name].sum().backward()
        assert len(coll._engine._inflight) <= 3
    coll.flush()
    assert not coll._engine._inflight
    rows = client.pull(table_name, np.arange(6, dtype=np.int64))
    assert np.isfinite(rows).all()


def test_bad_features_are_named(client, table_name):
    coll = EmbeddingCollection(client, [EmbeddingTable(table_name, DIM, features=["x"])])
    with pytest.raises(KeyError, match="no key 'x'"):
        coll(JaggedFeatures.from_dense(["y"], np.zeros((2, 1), dtype=np.int64)))
    with pytest.raises(ValueError, match="lengths sum to 3"):
        JaggedFeatures(["x"], np.zeros(2, dtype=np.int64), np.array([1, 2]))
    with pytest.raises(TypeError, match="torch.int64"):
        JaggedFeatures(["x"], torch.zeros(2), torch.ones(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="pooling = 'max'"):
        EmbeddingTable("z", 2, pooling="max")
    with pytest.raises(TypeError, match="ids dtype float64"):
        coll(JaggedFeatures(["x"], np.zeros(2), np.array([1, 1])))


def test_custom_two_tower_example_learns():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "two_tower.py"
    spec = importlib.util.spec_from_file_location("two_tower", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # The planted preference gives an oracle AUC of about 0.8; a model that learned nothing is at 0.5.
    assert mod.main(["--steps", "150", "--batch", "256"]) > 0.65
