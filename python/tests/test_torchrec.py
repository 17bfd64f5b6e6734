"""pstrain.torchrec against TorchRec's own modules: TorchRec's DLRM (and DLRM_DCN) with our EmbeddingBagCollection
trains exactly like the same model with TorchRec's EmbeddingBagCollection; EmbeddingCollection equals TorchRec's
for unpooled lookups; replay at staleness 2 equals a serial run; GradScaler; state_dict; bad KJTs."""

import copy
import itertools
import pickle

import numpy as np
import pytest
import torch
import torch.nn as nn
import torchrec
from torchrec import EmbeddingBagConfig, EmbeddingConfig, KeyedJaggedTensor, KeyedTensor, PoolingType
from torchrec.models.dlrm import DLRM, DLRM_DCN

import pstrain
from pstrain.torchrec import EmbeddingBagCollection, EmbeddingCollection

DIM = 4
ROWS = 40
LR = 0.05
FEATURES = ["f0", "f1", "f2"]
_prefix = itertools.count()


def prefix():
    """Table names no other test uses (tests share the cluster)."""
    return f"tr{next(_prefix)}_"


def configs(pooling=PoolingType.SUM, cls=EmbeddingBagConfig):
    kw = dict(pooling=pooling) if cls is EmbeddingBagConfig else {}
    return [cls(name=f"t{i}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f], **kw)
            for i, f in enumerate(FEATURES)]


def batches(seed, steps, batch=8, max_len=3, weighted=False, keys=FEATURES):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        lengths = rng.integers(0, max_len + 1, len(keys) * batch)
        values = rng.integers(0, ROWS, int(lengths.sum()))
        weights = torch.from_numpy(rng.uniform(0.5, 2.0, len(values)).astype(np.float32)) if weighted else None
        kjt = KeyedJaggedTensor(keys=keys, values=torch.from_numpy(values), lengths=torch.from_numpy(lengths),
                                weights=weights)
        dense = torch.from_numpy(rng.normal(size=(batch, 5)).astype(np.float32))
        labels = torch.from_numpy(rng.integers(0, 2, batch).astype(np.float32))
        out.append((dense, kjt, labels))
    return out


def make_dlrm(model_cls, ebc):
    torch.manual_seed(0)
    if model_cls is DLRM:
        return DLRM(embedding_bag_collection=ebc, dense_in_features=5, dense_arch_layer_sizes=[8, DIM],
                    over_arch_layer_sizes=[8, 1])
    return DLRM_DCN(embedding_bag_collection=ebc, dense_in_features=5, dense_arch_layer_sizes=[8, DIM],
                    over_arch_layer_sizes=[8, 1], dcn_num_layers=2, dcn_low_rank_dim=4)


def torchrec_twin(ours: EmbeddingBagCollection, weighted: bool, pooling=PoolingType.SUM):
    """TorchRec's EmbeddingBagCollection with our tables' current rows (loaded from our state_dict)."""
    theirs = torchrec.EmbeddingBagCollection(tables=configs(pooling), is_weighted=weighted)
    missing = theirs.load_state_dict(ours.state_dict())
    assert not missing.missing_keys and not missing.unexpected_keys
    return theirs


def train(model, data, opt, pre=None, after_backward=None):
    losses = []
    for i, (dense, kjt, y) in enumerate(data):
        if pre is not None and i + 1 < len(data):
            pre(data[i + 1][1])
        loss = nn.functional.binary_cross_entropy_with_logits(model(dense, kjt).squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        if after_backward is not None:
            after_backward()
        opt.step()
        losses.append(loss.item())
    return losses


def rows_of(ebc):
    return {k: v.clone() for k, v in ebc.state_dict().items()}


@pytest.mark.parametrize("model_cls,pooling,weighted", [
    (DLRM, PoolingType.SUM, False), (DLRM, PoolingType.MEAN, False), (DLRM, PoolingType.SUM, True),
    (DLRM_DCN, PoolingType.SUM, False)])
def test_torchrec_dlrm_with_our_collection_equals_torchrec(client, model_cls, pooling, weighted):
    data = batches(1, 6, weighted=weighted)
    ours = EmbeddingBagCollection(configs(pooling), client, is_weighted=weighted, optimizer="sgd", lr=LR,
                                  table_prefix=prefix())
    theirs = torchrec_twin(ours, weighted, pooling)
    initial = rows_of(ours)
    m_ours, m_theirs = make_dlrm(model_cls, ours), make_dlrm(model_cls, theirs)
    # The same dense SGD over the dense parameters; TorchRec's tables take plain SGD at the servers' rate.
    l_ours = train(m_ours, data, torch.optim.SGD(m_ours.parameters(), lr=LR))
    l_theirs = train(m_theirs, data, torch.optim.SGD(m_theirs.parameters(), lr=LR))
    np.testing.assert_allclose(l_ours, l_theirs, rtol=1e-5, atol=1e-6)
    ours.wait()
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=1e-5, atol=1e-6)
    dense_theirs = {n: p for n, p in m_theirs.named_parameters() if "embedding_bags" not in n}
    assert list(dict(m_ours.named_parameters())) == list(dense_theirs)
    for n, p in m_ours.named_parameters():
        torch.testing.assert_close(p, dense_theirs[n], rtol=1e-5, atol=1e-6, msg=n)
    # The rows moved: the test compares trained tables, not initial ones.
    assert all((rows_of(ours)[k] != v).any() for k, v in initial.items())


def test_output_is_a_keyed_tensor_like_torchrec(client):
    ours = EmbeddingBagCollection(configs(), client, table_prefix=prefix())
    theirs = torchrec_twin(ours, False)
    _, kjt, _ = batches(2, 1)[0]
    a, b = ours(kjt), theirs(kjt)
    assert isinstance(a, KeyedTensor) and a.keys() == b.keys() and a.length_per_key() == b.length_per_key()
    torch.testing.assert_close(a.values(), b.values())
    assert [c.name for c in ours.embedding_bag_configs()] == ["t0", "t1", "t2"] and not ours.is_weighted()


def test_embedding_collection_equals_torchrec(client):
    cfgs = configs(cls=EmbeddingConfig)
    ours = EmbeddingCollection(cfgs, client, optimizer="sgd", lr=LR, table_prefix=prefix())
    theirs = torchrec.EmbeddingCollection(tables=configs(cls=EmbeddingConfig))
    theirs.load_state_dict(ours.state_dict())
    opt = torch.optim.SGD(theirs.parameters(), lr=LR)
    target = torch.linspace(-1, 1, DIM)
    for _, kjt, _ in batches(3, 5, max_len=4):
        out_a, out_b = ours(kjt), theirs(kjt)
        assert set(out_a) == set(out_b)
        losses = []
        for out in (out_a, out_b):
            loss = sum(((jt.values() - target) ** 2 * (i + 1)).sum() for i, (_, jt) in enumerate(sorted(out.items())))
            losses.append(loss)
        for k in out_a:
            torch.testing.assert_close(out_a[k].values(), out_b[k].values(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(out_a[k].lengths(), out_b[k].lengths())
        opt.zero_grad()
        losses[0].backward()
        losses[1].backward()
        opt.step()
    ours.wait()
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=1e-5, atol=1e-6)


def test_shared_table_dedups_across_features_and_carries_weights(client):
    """One item table for two sequence features (a history and a target): one pull of their distinct ids; the
    KJT's weights (e.g. timestamps) come back on the JaggedTensors."""
    cfg = [EmbeddingConfig(name="items", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["hist", "target"])]
    ec = EmbeddingCollection(cfg, client, table_prefix=prefix())
    kjt = KeyedJaggedTensor(keys=["hist", "target"], values=torch.tensor([1, 2, 3, 2, 5, 1]),
                            lengths=torch.tensor([2, 2, 1, 1]), weights=torch.tensor([10., 11, 12, 13, 14, 15]))
    before = ec.client.stats()["pull_rows"]
    out = ec(kjt)
    assert ec.client.stats()["pull_rows"] - before == 4  # ids 1, 2, 3, 5
    torch.testing.assert_close(out["hist"].weights(), torch.tensor([10., 11, 12, 13]))
    torch.testing.assert_close(out["target"].values()[1], out["hist"].values()[0])


@pytest.mark.parametrize("optimizer,options", [
    ("row_adagrad", {}),
    ("adam", {"precision": "bf16", "state_precision": "bf16"}),
])
def test_replay_at_staleness_2_equals_a_serial_run(client, optimizer, options):
    """Row-wise Adagrad on the servers (and Adam with bf16 rows and bf16 moments, issue 43: the replay rounds
    both as the servers do), a prefetched pipeline at K = 2 against K = 0 without prefetch: every step computes
    with the same rows (replay of the collection's own pushes), so the losses and rows are equal bit for bit
    (f32 on the wire, one trainer)."""
    data = batches(4, 10, max_len=2)  # a 40-row vocabulary: consecutive batches share many ids
    runs = []
    for k, pre in ((0, False), (2, True), (1, True)):
        ebc = EmbeddingBagCollection(configs(), client, optimizer=optimizer, lr=0.3 if optimizer != "adam" else 0.01,
                                     staleness=k, table_prefix=prefix(), seed=5, **options)
        m = make_dlrm(DLRM, ebc)
        losses = train(m, data, torch.optim.SGD(m.parameters(), lr=LR), pre=ebc.prefetch if pre else None)
        ebc.wait()
        runs.append((losses, rows_of(ebc), ebc.stats()))
    (l0, r0, _), (l2, r2, s2), (l1, r1, _) = runs
    assert l0 == l2 == l1
    for k in r0:
        assert torch.equal(r0[k], r2[k]) and torch.equal(r0[k], r1[k])
    assert s2["replay_seconds"] > 0 and s2["updates"] == 10


def test_grad_scaler_equals_unscaled_and_skips_non_finite_steps(client):
    data = batches(5, 4)
    results = []
    for scaled in (False, True):
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=scaled)
        ebc = EmbeddingBagCollection(configs(), client, optimizer="sgd", lr=LR, table_prefix=prefix(), seed=3,
                                     grad_scaler=scaler if scaled else None)
        m = make_dlrm(DLRM, ebc)
        opt = torch.optim.SGD(m.parameters(), lr=LR)
        for dense, kjt, y in data:
            loss = nn.functional.binary_cross_entropy_with_logits(m(dense, kjt).squeeze(1), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        ebc.wait()
        results.append(rows_of(ebc))
        if scaled:
            # An overflowing step: every gradient is inf; the scaler skips the dense step, the collection the push.
            before = rows_of(ebc)
            dense, kjt, y = data[0]
            loss = m(dense, kjt).sum() * float("inf")
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            ebc.wait()
            assert ebc.stats()["skipped_updates"] == 1 and scaler.get_scale() < 1024.0
            for k, v in rows_of(ebc).items():
                assert torch.equal(v, before[k])
    for k in results[0]:
        torch.testing.assert_close(results[1][k], results[0][k], rtol=1e-5, atol=1e-7)
        assert (results[0][k] != 0).any()


def test_unfused_updates_accumulate_clip_and_unscale_like_dense_parameters(client):
    """fused=False: backward accumulates on the handle's parameters; GradScaler.step unscales them, a clip acts
    on them, two backwards before one step add up, and step() pushes: the same rows as TorchRec's tables under
    the same loop."""
    data = batches(6, 3)
    ours = EmbeddingBagCollection(configs(), client, optimizer="sgd", lr=LR, table_prefix=prefix(), fused=False)
    theirs = torchrec_twin(ours, False)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    for ebc, opt in ((ours, ours.fused_optimizer), (theirs, torch.optim.SGD(theirs.parameters(), lr=LR))):
        for dense, kjt, _ in data:
            opt.zero_grad()
            for half in (0, 1):  # two micro-batches, one step
                out = ebc(kjt).values()
                scaler.scale((out * (half + 1.0)).pow(2).sum()).backward()
            scaler.unscale_(opt)
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, max_norm=0.5)
            scaler.step(opt)
            scaler.update()
            scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    ours.wait()
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=1e-5, atol=1e-6)


def test_learning_rate_handle_and_scheduler(client):
    """The per-table handle's lr reaches an sgd table every step (a scheduler halves it); a rate that is not a
    finite number >= 0 is refused naming the table."""
    data = batches(7, 4)
    ours = EmbeddingBagCollection(configs(), client, optimizer="sgd", lr=LR, table_prefix=prefix())
    theirs = torchrec_twin(ours, False)
    sched = torch.optim.lr_scheduler.StepLR(ours.fused_optimizer, step_size=1, gamma=0.5)
    opt_t = torch.optim.SGD(theirs.parameters(), lr=LR)
    sched_t = torch.optim.lr_scheduler.StepLR(opt_t, step_size=1, gamma=0.5)
    for _, kjt, _ in data:
        for ebc, opt in ((ours, ours.fused_optimizer), (theirs, opt_t)):
            opt.zero_grad()
            ebc(kjt).values().sum().backward()
            opt.step()
        sched.step()
        sched_t.step()
    ours.wait()
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=1e-5, atol=1e-6)
    ada = EmbeddingBagCollection(configs(), client, optimizer="row_adagrad", lr=0.1, table_prefix=prefix())
    ada.fused_optimizer.param_groups[1]["lr"] = -0.05
    with pytest.raises(ValueError, match=r"table '.*t1': learning rate -0.05 .*finite number >= 0"):
        ada(data[0][1])


def _reference_update(optimizer, w, state, row, g, lr, eps=1e-8, betas=(0.9, 0.999)):
    """One row of the servers' optimizer (embedding/src/optimizer.rs), in float64: row-wise Adagrad as FBGEMM's,
    Adam with the row's own step count."""
    if optimizer == "row_adagrad":
        acc = state.setdefault(row, np.zeros(1))
        acc += np.mean(g * g)
        w[row] -= lr / (np.sqrt(acc) + eps) * g
    else:
        m, v, t = state.setdefault(row, [np.zeros_like(g), np.zeros_like(g), 0])
        t += 1
        m[:] = betas[0] * m + (1 - betas[0]) * g
        v[:] = betas[1] * v + (1 - betas[1]) * g * g
        state[row][2] = t
        bc1, bc2 = 1 - betas[0] ** t, 1 - betas[1] ** t
        w[row] -= (lr / bc1) * (m / (np.sqrt(v) / np.sqrt(bc2) + eps))


@pytest.mark.parametrize("optimizer", ["row_adagrad", "adam"])
def test_scheduler_reaches_tables_whose_optimizer_keeps_state(client, optimizer):
    """A StepLR on the handle reaches row-wise Adagrad and Adam tables every step (each push carries its
    lr_scale): the rows equal a reference of the optimizer at the scheduled rates; at staleness 2 with prefetch
    (replay of the pushes in flight, each at its own rate) they equal staleness 0 bit for bit."""
    data = batches(8, 6, max_len=2)
    runs = []
    for k in (0, 2):
        ebc = EmbeddingBagCollection(configs(), client, optimizer=optimizer, lr=0.2, eps=1e-8, staleness=k,
                                     table_prefix=prefix(), seed=9)
        initial = rows_of(ebc)
        sched = torch.optim.lr_scheduler.StepLR(ebc.fused_optimizer, step_size=1, gamma=0.5)
        for i, (_, kjt, _) in enumerate(data):
            if k and i + 1 < len(data):
                ebc.prefetch(data[i + 1][1])
            ebc.fused_optimizer.zero_grad()
            ebc(kjt).values().pow(2).sum().backward()
            ebc.fused_optimizer.step()
            sched.step()
        ebc.wait()
        runs.append((initial, rows_of(ebc)))
    (init0, rows0), (init2, rows2) = runs
    for key in rows0:
        assert torch.equal(rows0[key], rows2[key]), key
    # The reference: TorchRec's module on the same initial rows computes the gradients, the optimizer above
    # applies them at 0.2, 0.1, 0.05, ... to the rows the batch touched.
    twin = torchrec.EmbeddingBagCollection(tables=configs())
    twin.load_state_dict(init0)
    weights = {f"embedding_bags.t{i}.weight": p for i, p in enumerate(twin.embedding_bags[f"t{i}"].weight
                                                                        for i in range(len(FEATURES)))}
    state = {key: {} for key in weights}
    for i, (_, kjt, _) in enumerate(data):
        for p in weights.values():
            p.grad = None
        twin(kjt).values().pow(2).sum().backward()
        lr = 0.2 * 0.5 ** i
        with torch.no_grad():
            for f, key in zip(FEATURES, weights):
                w = weights[key].data.double().numpy().copy()
                g = weights[key].grad.double().numpy()
                for row in np.unique(kjt[f].values().numpy()):
                    _reference_update(optimizer, w, state[key], int(row), g[row].copy(), lr)
                weights[key].data.copy_(torch.from_numpy(w).float())
    for key, p in weights.items():
        torch.testing.assert_close(rows0[key], p.data, rtol=1e-5, atol=1e-6, msg=key)
        assert not torch.equal(rows0[key], init0[key])


def test_state_dict_round_trip_restores_every_row(client, tmp_path):
    ebc = EmbeddingBagCollection(configs(), client, optimizer="sgd", lr=LR, table_prefix=prefix())
    m = make_dlrm(DLRM, ebc)
    train(m, batches(8, 3), torch.optim.SGD(m.parameters(), lr=LR))
    saved = m.state_dict()
    assert {f"sparse_arch.embedding_bag_collection.embedding_bags.t{i}.weight" for i in range(3)} <= set(saved)
    torch.save(saved, tmp_path / "model.pt")
    train(m, batches(9, 3), torch.optim.SGD(m.parameters(), lr=LR))
    assert any(not torch.equal(v, saved[k]) for k, v in m.state_dict().items())
    m.load_state_dict(torch.load(tmp_path / "model.pt"))
    for k, v in m.state_dict().items():
        assert torch.equal(v, saved[k]), k
    # Tables whose optimizer has state take their weights too (the rows' state stays on the servers).
    ada = EmbeddingBagCollection(configs(), client, optimizer="row_adagrad", lr=0.1, table_prefix=prefix())
    m = make_dlrm(DLRM, ada)
    train(m, batches(8, 3), torch.optim.SGD(m.parameters(), lr=LR))
    saved = {k: v.clone() for k, v in m.state_dict().items()}
    train(m, batches(9, 3), torch.optim.SGD(m.parameters(), lr=LR))
    assert any(not torch.equal(v, saved[k]) for k, v in m.state_dict().items())
    m.load_state_dict(saved)
    for k, v in m.state_dict().items():
        assert torch.equal(v, saved[k]), k
    bad = {k: v.clone() for k, v in saved.items()}
    key = "sparse_arch.embedding_bag_collection.embedding_bags.t0.weight"
    bad[key][3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"table '.*t0' row 3 column 1 is nan"):
        m.load_state_dict(bad)


def test_pickling_and_deepcopy_fail_naming_what_to_do(client):
    ebc = EmbeddingBagCollection(configs(), client, table_prefix=prefix())
    m = make_dlrm(DLRM, ebc)
    for f in (lambda: pickle.dumps(m), lambda: copy.deepcopy(m), lambda: copy.deepcopy(client)):
        with pytest.raises(TypeError, match="state_dict"):
            f()


def test_bad_kjts_are_named(client):
    ebc = EmbeddingBagCollection(configs(), client, table_prefix=prefix())
    good = dict(keys=FEATURES, values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="lengths sum to 3, but there are 4 values"):
        ebc(KeyedJaggedTensor(keys=FEATURES, values=torch.tensor([1, 2, 3, 4]), lengths=torch.tensor([1, 1, 1])))
    with pytest.raises(KeyError, match="no feature 'f2'"):
        ebc(KeyedJaggedTensor(keys=["f0", "f1", "x"], values=good["values"], lengths=good["lengths"]))
    with pytest.raises(TypeError, match="values dtype torch.float32"):
        ebc(KeyedJaggedTensor(keys=FEATURES, values=torch.tensor([1.0, 2.0, 3.0]), lengths=good["lengths"]))
    with pytest.raises(ValueError, match=r"feature 'f1': id 40 at position 0.*num_embeddings 40"):
        ebc(KeyedJaggedTensor(keys=FEATURES, values=torch.tensor([1, 40, 3]), lengths=good["lengths"]))
    with pytest.raises(ValueError, match=r"id -1 at position 0"):
        ebc(KeyedJaggedTensor(keys=FEATURES, values=torch.tensor([-1, 2, 3]), lengths=good["lengths"]))
    with pytest.raises(ValueError, match="length -1 of key 'f0' sample 0 is negative"):
        ebc(KeyedJaggedTensor(keys=FEATURES, values=torch.tensor([1, 2, 3]), lengths=torch.tensor([-1, 2, 2])))
    weighted = EmbeddingBagCollection(configs(), client, is_weighted=True, table_prefix=prefix())
    with pytest.raises(ValueError, match="no weights"):
        weighted(KeyedJaggedTensor(**good))
    with pytest.raises(TypeError, match="KeyedJaggedTensor"):
        ebc({"f0": torch.tensor([1])})
    with pytest.raises(ValueError, match="init_fn"):
        EmbeddingBagCollection([EmbeddingBagConfig(name="x", embedding_dim=2, num_embeddings=3, feature_names=["x"],
                                                   init_fn=torch.nn.init.ones_)], client, table_prefix=prefix())
    assert ebc(KeyedJaggedTensor(**good)).values().shape == (1, 3 * DIM)


def test_uint64_ids_and_their_int64_view(client, table_name):
    """What a DataLoader makes of read_criteo's ids (torch.uint64), ids at or above 2^63 among them, and their
    int64 view: all look up the same rows as the numpy client's uint64 pulls."""
    from pstrain.torch import EmbeddingCollection as TorchCollection, EmbeddingTable, JaggedFeatures

    coll = TorchCollection(client, [EmbeddingTable(table_name, DIM, pooling="none")])
    ids = np.array([5, (1 << 63) + 7, (1 << 64) - 1], dtype=np.uint64)
    want = client.pull(table_name, ids)
    as_u64 = torch.from_numpy(ids.view(np.int64)).view(torch.uint64)
    for values in (as_u64, as_u64.view(torch.int64), ids):
        out = coll(JaggedFeatures([table_name], values, np.ones(3, dtype=np.int64)))[table_name]
        np.testing.assert_array_equal(out.detach().numpy(), want)


def test_tables_of_different_names_start_different(client):
    from pstrain.torch import EmbeddingCollection as TorchCollection, EmbeddingTable, JaggedFeatures

    p = prefix()
    coll = TorchCollection(client, [EmbeddingTable(p + "users", DIM), EmbeddingTable(p + "items", DIM)])
    out = coll(JaggedFeatures.from_dense([p + "users", p + "items"], np.array([[5, 5]])))
    assert not torch.equal(out[p + "users"], out[p + "items"])


def test_two_ranks_agree_on_table_ids(cluster):
    """Two processes' clients connect before either registers, then register the same tables in different
    orders: no TableConflict, the same ids, and one's pushes are the other's rows."""
    p = prefix()
    a = pstrain.Client(cluster.servers, cluster.tls_dir)
    b = pstrain.Client(cluster.servers, cluster.tls_dir)
    ta = [a.register_table(p + n, 2, optimizer="sgd", lr=1.0) for n in ("x", "y", "z")]
    tb = [b.register_table(p + n, 2, optimizer="sgd", lr=1.0) for n in ("z", "x", "y")]
    assert {t.name: t.id for t in ta} == {t.name: t.id for t in tb}
    ids = np.array([3], dtype=np.int64)
    before = b.pull(p + "y", ids)
    a.push(p + "y", ids, np.ones((1, 2), np.float32))
    np.testing.assert_allclose(b.pull(p + "y", ids), before - 1.0)
    a.close()
    b.close()


def test_sequence_example_learns_in_time_order():
    """The SASRec-like example: trained on earlier windows, it ranks the next item well above chance (0.10) on
    the following window, with its item table on the servers."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "sequence.py"
    spec = importlib.util.spec_from_file_location("sequence_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    s = mod.main(["--users", "600", "--events", "30", "--windows", "3", "--items", "500", "--clusters", "10"])
    hr = [w["hit_rate_at_10"] for w in s["windows"]]
    assert len(hr) == 2 and hr[-1] > 0.3, hr


def test_dlrm_v2_spec_multi_hot_data_trains_from_python(client, tmp_path):
    """A DLRM-v2-shaped spec's multi-hot layout read from Python (read_criteo(spec=...)), fed as a KJT to
    DLRM_DCN with our collection and with TorchRec's: the same losses and rows."""
    import pathlib
    import multihot_data

    root = pathlib.Path(__file__).resolve().parents[2]
    spec = root / "model" / "specs" / "dlrm-v2-small.toml"
    layout = pstrain.data.spec_layout(str(spec))
    caps = [f["tokens"] for f in layout]
    path = tmp_path / "mh.tsv"
    multihot_data.write(str(path), caps, 96, 3)
    y, dense, feats = pstrain.read_criteo(str(path), spec=str(spec))
    names = list(feats)
    assert max(int(feats[n][1].max()) for n in names) > 1  # multi-hot bags, cut to the spec's tokens
    assert all(int(feats[n][1].max()) <= f["tokens"] for n, f in zip(names, layout))
    # TorchRec's tables are indexed by row: map each feature's 64-bit ids to 0..vocab-1 (same for both).
    vocab = {n: np.unique(feats[n][0]) for n in names}
    cfgs = lambda: [EmbeddingBagConfig(name=f"t_{n}", embedding_dim=4, num_embeddings=max(1, len(vocab[n])),
                                       feature_names=[n]) for n in names]
    def kjt(a, b):
        values, lengths = [], []
        for n in names:
            v, l = feats[n]
            off = np.concatenate([[0], np.cumsum(l)])
            values.append(np.searchsorted(vocab[n], v[off[a]:off[b]]))
            lengths.append(l[a:b])
        return KeyedJaggedTensor(keys=names, values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
                                 lengths=torch.from_numpy(np.concatenate(lengths)))
    data = [(torch.from_numpy(dense[a:a + 32, :5]), kjt(a, a + 32), torch.from_numpy(y[a:a + 32]))
            for a in range(0, 96, 32)]
    ours = EmbeddingBagCollection(cfgs(), client, optimizer="sgd", lr=LR, table_prefix=prefix())
    theirs = torchrec.EmbeddingBagCollection(tables=cfgs())
    theirs.load_state_dict(ours.state_dict())
    m_ours, m_theirs = make_dlrm(DLRM_DCN, ours), make_dlrm(DLRM_DCN, theirs)
    l_ours = train(m_ours, data, torch.optim.SGD(m_ours.parameters(), lr=LR))
    l_theirs = train(m_theirs, data, torch.optim.SGD(m_theirs.parameters(), lr=LR))
    np.testing.assert_allclose(l_ours, l_theirs, rtol=1e-5, atol=1e-6)
    ours.wait()
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=1e-5, atol=1e-6)


def _serve(export_dir, data_dir, *extra):
    """``ps-serve --export export_dir`` on a free loopback port; returns (process, base URL) once /readyz is 200."""
    import subprocess
    import time
    import urllib.error
    import urllib.request

    proc = subprocess.Popen([pstrain.find_binary("ps-serve"), "--export", str(export_dir), "--data-dir",
                             str(data_dir), "--listen", "127.0.0.1:0", *extra], stdout=subprocess.PIPE, text=True)
    first = proc.stdout.readline().strip()
    assert first.startswith("ps-serve listening on http://"), first
    url = first.removeprefix("ps-serve listening on ")
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, f"ps-serve exited with {proc.returncode}"
        try:
            if urllib.request.urlopen(url + "/readyz", timeout=5).status == 200:
                return proc, url
        except urllib.error.HTTPError:
            pass
        assert time.monotonic() < deadline, "ps-serve not ready in 120 s"
        time.sleep(0.05)


def _check_open_export(version_dir, client, model, tables):
    """The export read without pstrain, as docs/serving.md shows: every shard's ``tables.safetensors`` (ids,
    weights, optimizer state per table) and ``dense.safetensors`` load with ``safetensors.numpy``; the rows equal
    those pulled from the servers bit for bit, and the dense tensors the model's layers."""
    import glob
    import json
    import os

    from safetensors import safe_open
    from safetensors.numpy import load_file

    shards = sorted(glob.glob(os.path.join(version_dir, "ps", "shard-*-of-*", "tables.safetensors")))
    assert len(shards) == 2, shards
    seen = {}
    for path in shards:
        tensors = load_file(path)
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata()
        assert meta["format"] == "pstrain.tables.v1"
        for name in tables:
            ids, weight = tensors[f"{name}.ids"], tensors[f"{name}.weight"]
            assert ids.dtype == np.uint64 and weight.dtype == np.float32 and weight.shape == (len(ids), 8)
            assert tensors[f"{name}.state"].shape == (len(ids), 1), "row-wise Adagrad's accumulator"
            assert json.loads(meta[f"{name}.config"])["dim"] == 8
            seen.setdefault(name, []).append((ids, weight))
    for name in tables:
        ids = np.concatenate([i for i, _ in seen[name]])
        weight = np.concatenate([w for _, w in seen[name]])
        assert len(ids) > 0 and len(np.unique(ids)) == len(ids), "each id on one shard"
        np.testing.assert_array_equal(client.pull(name, ids).view(np.uint32), weight.view(np.uint32))
    dense = load_file(os.path.join(version_dir, "dense.safetensors"))
    assert sorted(dense) == sorted(["bottom.0.weight", "bottom.0.bias", "bottom.1.weight", "bottom.1.bias",
                                    "top.0.weight", "top.0.bias", "top.1.weight", "top.1.bias"])
    first = model.dense_arch.model._mlp[0]._linear
    np.testing.assert_array_equal(dense["bottom.0.weight"], first.weight.detach().numpy())
    np.testing.assert_array_equal(dense["bottom.0.bias"], first.bias.detach().numpy())


def test_export_of_a_torchrec_dlrm_is_served_with_its_own_predictions(tmp_path):
    """TorchRec's DLRM with our collection, trained on Criteo rows read with TorchRec's ids
    (int(token or "0", 16) % num_embeddings), exported with export_dlrm: ps-serve answers the test rows with the
    model's own probabilities (to float tolerance), rows the training never saw included (initializer)."""
    import json
    import urllib.request

    from pstrain.data import generate, read_criteo
    from pstrain.torchrec import export_dlrm

    cols = [f"C{i}" for i in range(1, 27)]
    hash_size = 300
    layout = [dict(column=c, hash_size=hash_size, ids="token", name=c, table=c) for c in cols]
    train_tsv = generate(4096, str(tmp_path / "train.tsv"), 1, 7)
    test_tsv = generate(600, str(tmp_path / "test.tsv"), 2, 7)

    def kjt_of(sparse, rows):
        values = [torch.from_numpy(sparse[c][0][rows].astype(np.int64)) for c in cols]
        return KeyedJaggedTensor(keys=cols, values=torch.cat(values),
                                 lengths=torch.ones(len(cols) * len(rows), dtype=torch.int64))

    y, dense, sparse = read_criteo(train_tsv, layout=layout)
    assert max(int(sparse[c][0].max()) for c in cols) < hash_size
    with pstrain.LocalCluster(servers=2, checkpoint_root=str(tmp_path)) as cluster, \
            pstrain.Client(cluster.servers, cluster.tls_dir) as client:
        tables = [EmbeddingBagConfig(name=f"e_{c}", embedding_dim=8, num_embeddings=hash_size, feature_names=[c])
                  for c in cols]
        ebc = EmbeddingBagCollection(tables, client, optimizer="row_adagrad", lr=0.05, staleness=1)
        torch.manual_seed(0)
        model = DLRM(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[16, 8],
                     over_arch_layer_sizes=[16, 1])
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for start in range(0, len(y), 512):
            rows = np.arange(start, min(start + 512, len(y)))
            logits = model(torch.from_numpy(dense[rows]), kjt_of(sparse, rows)).squeeze(1)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, torch.from_numpy(y[rows]))
            opt.zero_grad()
            loss.backward()
            opt.step()
        version_dir = export_dlrm(model, tmp_path / "export")
        assert version_dir.endswith("v000000000008"), version_dir
        _check_open_export(version_dir, client, model, [f"e_{c}" for c in cols])
        yt, dt, st = read_criteo(test_tsv, layout=layout)
        with torch.no_grad():
            want = torch.sigmoid(model(torch.from_numpy(dt), kjt_of(st, np.arange(len(yt)))).squeeze(1)).numpy()
        with pytest.raises(TypeError, match="DLRM_DCN is not torchrec.models.dlrm.DLRM"):
            export_dlrm(make_dlrm(DLRM_DCN, EmbeddingBagCollection(configs(), client, table_prefix=prefix())),
                        tmp_path / "export")
    # The servers are gone: ps-serve reads the export alone.
    lines = [line.split("\t", 1)[1] for line in open(test_tsv).read().splitlines()]
    proc, url = _serve(tmp_path / "export", tmp_path / "serve")
    try:
        req = urllib.request.Request(url + "/v1/predict", data="\n".join(lines).encode(),
                                     headers={"Content-Type": "text/tab-separated-values"})
        got = np.array(json.loads(urllib.request.urlopen(req, timeout=60).read())["probabilities"])
    finally:
        proc.kill()
        proc.wait()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert want.std() > 0.01, "a model that learned something"


def test_export_refusals_name_the_problem(client, tmp_path):
    """export_dlrm refuses, naming why: a feature that reads no Criteo column, TorchRec's own collection (its
    tables are not on the servers), and a root outside the servers' checkpoint root (the servers refuse to write
    there, and the staged version is left for the next attempt to replace)."""
    from pstrain.torchrec import export_dlrm

    ours = EmbeddingBagCollection(configs(), client, table_prefix=prefix())
    torch.manual_seed(0)
    criteo_model = DLRM(embedding_bag_collection=ours, dense_in_features=13, dense_arch_layer_sizes=[8, DIM],
                        over_arch_layer_sizes=[8, 1])
    columns = {"f0": "C1", "f1": "C2", "f2": "C3"}
    with pytest.raises(ValueError, match=r"feature 'f0' reads no Criteo column.*columns=\{'f0': 'C<n>'\}"):
        export_dlrm(criteo_model, tmp_path / "export")
    with pytest.raises(TypeError, match=r"not pstrain.torchrec.EmbeddingBagCollection"):
        export_dlrm(make_dlrm(DLRM, torchrec_twin(ours, False)), tmp_path / "export")
    with pytest.raises(ValueError, match=r"reads 5 dense features; Criteo rows have 13"):
        export_dlrm(make_dlrm(DLRM, ours), tmp_path / "export", columns=columns)
    with pytest.raises(ValueError, match=r"outside the checkpoint root"):
        export_dlrm(criteo_model, tmp_path / "export", columns=columns)
    assert not (tmp_path / "export" / "LATEST").exists()


def test_ps_serve_follows_a_python_export_live(tmp_path):
    """ps-serve started on a pstrain export with --subscribe follows the training servers: rows the collection
    updates after the export reach serving (the delta sync finds the tables by the ids the manifest names)."""
    import json
    import time
    import urllib.request

    from pstrain.torchrec import export_dlrm

    cols, hash_size = ["C1", "C2", "C3"], 50
    rng = np.random.default_rng(3)

    def batch(n=64):
        values = torch.from_numpy(rng.integers(0, hash_size, n * len(cols)))
        kjt = KeyedJaggedTensor(keys=cols, values=values, lengths=torch.ones(n * len(cols), dtype=torch.int64))
        return torch.from_numpy(rng.normal(size=(n, 13)).astype(np.float32)), kjt

    with pstrain.LocalCluster(servers=2, checkpoint_root=str(tmp_path)) as cluster, \
            pstrain.Client(cluster.servers, cluster.tls_dir) as client:
        tables = [EmbeddingBagConfig(name=f"live_{c}", embedding_dim=4, num_embeddings=hash_size, feature_names=[c])
                  for c in cols]
        ebc = EmbeddingBagCollection(tables, client, optimizer="sgd", lr=0.5)
        torch.manual_seed(0)
        model = DLRM(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[8, 4],
                     over_arch_layer_sizes=[8, 1])

        def train(steps):
            for _ in range(steps):
                dense, kjt = batch()
                model(dense, kjt).sum().backward()
            ebc.wait()

        train(2)
        export_dlrm(model, tmp_path / "export")
        at_export = ebc.state_dict()["embedding_bags.live_C1.weight"].clone()
        train(3)
        now = ebc.state_dict()["embedding_bags.live_C1.weight"]
        row = int(torch.nonzero((now != at_export).any(dim=1))[0])
        table_id = ebc._engine.tables["live_C1"].id
        proc, url = _serve(tmp_path / "export", tmp_path / "serve", "--subscribe", ",".join(cluster.servers),
                           "--tls-dir", cluster.tls_dir, "--sync-wait-ms", "200", "--enable-embedding-api")
        try:
            deadline = time.monotonic() + 120
            while True:
                got = json.loads(urllib.request.urlopen(f"{url}/v1/embedding?table={table_id}&id={row}",
                                                        timeout=10).read())["row"]
                if np.allclose(got, now[row].numpy(), rtol=0, atol=1e-6):
                    break
                assert time.monotonic() < deadline, f"serving still holds {got}, the servers {now[row].tolist()}"
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait()
