"""bench/pytorch's model-spec DLRM (dlrm_reference.py --model-spec, the dlrmspec package): spec parsing and
refusals, multi-hot EmbeddingBag pooling against hand computations, DCN against a plain loop, training lowers the
loss, and the command line end to end on tiny multi-hot data. No cluster needed; runs in seconds."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import multihot_data

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "pytorch"
sys.path.insert(0, str(BENCH))

from dlrmspec import data as sdata  # noqa: E402
from dlrmspec.model import LowRankCrossNet, SpecDlrm  # noqa: E402
from dlrmspec.spec import SpecError, load_spec, loads_spec  # noqa: E402

MLPERF_TOKENS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


def spec_text(features, interaction='kind = "dot"', bottom="[8, 4]", top="[8, 1]", sparse="dim = 4", extra=""):
    feats = "".join(f"\n[[feature]]\n{f}\n" for f in features)
    return (f'name = "t"\nbottom_mlp = {bottom}\ntop_mlp = {top}\n{extra}\n[interaction]\n{interaction}\n'
            f"[sparse]\n{sparse}\n{feats}")


def one_per_column(n, extra=""):
    return [f'column = "C{i + 1}"\ntable = "C{i + 1}"\n{extra}' for i in range(n)]


def run_main(args):
    """dlrm_reference.py's main() in this process (a subprocess would spend seconds importing torch)."""
    import dlrm_reference

    argv, threads = sys.argv, torch.get_num_threads()
    sys.argv = ["dlrm_reference.py"] + [str(a) for a in args]
    try:
        dlrm_reference.main()
    finally:
        sys.argv = argv
        torch.set_num_threads(threads)


# ---- specs ----


def test_shipped_specs():
    k = load_spec(str(ROOT / "model/specs/dlrm-kaggle.toml"))
    assert (k.name, k.interaction, k.bottom_mlp, k.top_mlp) == ("dlrm-kaggle", "dot", [512, 256, 64, 16], [512, 256, 1])
    assert [f.name for f in k.features] == [f"C{i}" for i in range(1, 27)] and len(k.tables) == 26
    assert {(f.dim, f.pooling, f.tokens, f.hash_size, f.optimizer, f.lr, f.encoding) for f in k.features} == {
        (16, "sum", 1, 0, "adagrad", 0.05, "f16")}
    assert (k.dense_optimizer, k.dense_lr, k.interaction_width) == ("adam", 0.002, 367)
    for name, dim, cap, width in (("dlrm-v2", 128, 400_000, 128 * 27), ("dlrm-v2-small", 16, 20_000, 16 * 27)):
        v = load_spec(name)  # a shipped spec by name, as `trainer --model-spec NAME`
        assert v.name == name and v.interaction == "dcn" and v.interaction_width == width
        assert [f.tokens for f in v.features] == MLPERF_TOKENS
        assert {f.dim for f in v.features} == {dim} and max(f.hash_size for f in v.features) == cap
        assert all(f.hash_size >= 1 for f in v.features)
    assert load_spec("dlrm-v2").dcn_layers == 3 and load_spec("dlrm-v2").dcn_rank == 512


def test_defaults_and_shared_tables():
    s = loads_spec(spec_text(['column = "C2"\ntable = "shared"', 'column = "C5"\ntable = "shared"\ntokens = 4',
                              'column = "C1"\ntable = "own"\npooling = "mean"'], sparse="", bottom="[8, 16]"),
                   default_name="x")
    assert [t.name for t in s.tables] == ["shared", "own"] and s.tables[0].features == [0, 1]
    f = s.features[1]
    assert (f.column, f.dim, f.tokens, f.pooling, f.optimizer, f.lr, f.hash_size, f.encoding) == (
        4, 16, 4, "sum", "adagrad", 0.05, 0, "f16")
    assert s.dense_optimizer is None and s.dense_lr is None


@pytest.mark.parametrize(
    "text, needle",
    [
        (spec_text(one_per_column(4), extra="bogus = 1"), "bogus: unknown field"),
        (spec_text(one_per_column(4), sparse="dim = 4\nsize = 3"), "sparse.size: unknown field"),
        (spec_text(one_per_column(3) + ['column = "C4"\ntable = "C4"\nwidth = 4']),
         "feature[3] (C4).width: unknown field"),
        (spec_text(one_per_column(3) + ['column = "C4"\ntable = "C4"\ndim = 0']),
         "feature[3] (C4).dim: must be at least 1"),
        (spec_text(one_per_column(2), sparse="dim = 0"), "sparse.dim: must be at least 1"),
        (spec_text(one_per_column(2) + ['column = "C3"']), "feature[2] (C3).table: missing"),
        (spec_text(one_per_column(2) + ['column = "C3"\ntable = "C3"\ndim = 8']),
         "feature[2] (C3).dim: 8 does not fit interaction.kind = \"dot\""),
        (spec_text(['column = "C1"\ntable = "t"', 'column = "C2"\ntable = "t"\ndim = 8'],
                   interaction='kind = "dcn"\nlayers = 1\nrank = 2'),
         "feature[1] (C2).dim: 8 differs from 4 of feature[0] (C1)"),
        (spec_text(['column = "C1"\ntable = "t"', 'column = "C2"\ntable = "t"\nhash_size = 5']),
         "feature[1] (C2).hash_size"),
        (spec_text(['column = "C1"\ntable = "a"', 'column = "C1"\ntable = "b"']),
         "feature[1] (C1).column: C1 is already read"),
        (spec_text(['column = "C27"\ntable = "a"']), "feature[0].column: 'C27' is not a Criteo column"),
        (spec_text(one_per_column(2), top="[8, 2]"), "top_mlp[1]: the last size must be 1"),
        (spec_text(one_per_column(2), interaction='kind = "dcn"\nlayers = 2'), "interaction.rank: missing"),
        (spec_text(one_per_column(2), interaction='kind = "dot"\nrank = 2'),
         "interaction.rank: only for kind = \"dcn\""),
        (spec_text(one_per_column(2), interaction='kind = "cross"'), "interaction.kind: 'cross' is not one of"),
        (spec_text(one_per_column(2), sparse='dim = 4\npooling = "max"'), "sparse.pooling: 'max' is not one of"),
        (spec_text(one_per_column(1) + ['column = "C2"\ntable = "C2"\nencoding = "f8"']), "feature[1] (C2).encoding"),
        (spec_text(one_per_column(2), extra="dense_inputs = 12"), "dense_inputs: must be 13"),
        (spec_text(one_per_column(2), extra='[dense]\noptimizer = "lamb"'), "dense.optimizer: 'lamb' is not one of"),
        (spec_text([]), "feature: no [[feature]] entries"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(text, needle):
    with pytest.raises(SpecError) as e:
        loads_spec(text, path="bad.toml")
    assert needle in str(e.value) and str(e.value).startswith("bad.toml: ")


def test_encoding_pull_push_is_accepted():
    s = loads_spec(spec_text(one_per_column(2), sparse='dim = 4\nencoding = "f16/int8"'))
    assert s.features[0].encoding == "f16/int8"


# ---- multi-hot bags ----

TOK = {k: f"{v:08x}" for k, v in dict(a=0xA1, b=0xB2, c=0xC3, d=0xD4, e=0xE5, f=0xF6).items()}


def tsv_line(label, sparse):
    fields = [""] * 26
    for col, text in sparse.items():
        fields[col - 1] = text
    return "\t".join([str(label)] + [str(i) for i in range(13)] + fields)


def test_pooling_matches_hand_computation(tmp_path):
    spec = loads_spec(spec_text(
        [
            'column = "C1"\ntable = "s"\ntokens = 3',                      # sum, shared table with C4
            'column = "C2"\ntable = "m"\ntokens = 3\npooling = "mean"',
            'column = "C3"\ntable = "o"',                                  # one-hot
            'column = "C4"\ntable = "s"\ntokens = 3',
            'column = "C5"\ntable = "h"\ntokens = 2\nhash_size = 16',       # 0xa1 % 16 == 0xf1 % 16
        ], interaction='kind = "dcn"\nlayers = 1\nrank = 2', sparse="dim = 3"))
    t = TOK
    lines = [
        tsv_line(1, {1: f"{t['a']}|{t['b']}|{t['c']}|{t['d']}|{t['e']}", 2: f"{t['a']}|{t['b']}", 3: "",
                     4: t["a"], 5: f"{t['a']}|000000f1"}),
        tsv_line(0, {1: "", 2: "", 3: f"{t['c']}|{t['d']}", 4: f"{t['b']}|{t['f']}", 5: ""}),
        # an empty token makes the line malformed (as the trainer's parser): skipped, counted as bad
        tsv_line(1, {1: t["a"], 2: f"{t['a']}||{t['b']}", 3: "", 4: "", 5: ""}),
    ]
    path = tmp_path / "x.tsv"
    path.write_text("\n".join(lines) + "\n")
    layout = sdata.Layout(spec)
    vocabs = [dict() for _ in spec.tables]
    raw = sdata.parse_file(str(path), layout, vocabs)
    offsets, group_rows = layout.table_offsets([len(v) for v in vocabs])
    bags = sdata.finalize(raw, layout, offsets)
    assert raw.truncated == [2, 0, 1, 0, 0]  # C1: 5 tokens, 3 kept; C3: a one-hot `|` list keeps its first
    assert raw.bad == 1
    assert len(group_rows) == 1 and group_rows[0] == sum(len(v) for v in vocabs)
    model = SpecDlrm(layout, group_rows, torch.Generator().manual_seed(0), 0.5)
    w = model.emb[0].weight.detach()

    def row(table, key):
        ti = [tb.name for tb in spec.tables].index(table)
        return w[offsets[ti] + vocabs[ti][key]]

    calls = model.pooled(bags.batch(0, 2))
    got = {}
    for c, p in zip(layout.calls, calls):
        for k, f in enumerate(c.features):
            got[f] = p[:, k, :].detach()
    z = torch.zeros(3)
    h = lambda s: int(s, 16)
    expect = {
        0: [row("s", h(t["a"])) + row("s", h(t["b"])) + row("s", h(t["c"])), z],          # truncated to 3; empty
        1: [(row("m", h(t["a"])) + row("m", h(t["b"]))) / 2, z],                            # mean; empty bag -> 0
        2: [row("o", sdata.MISSING), row("o", h(t["c"]))],                                  # one-hot: empty is a row
        3: [row("s", h(t["a"])), row("s", h(t["b"])) + row("s", h(t["f"]))],               # shares C1's rows
        4: [2 * row("h", 0xA1 % 16), z],                                                    # both hash to row 1
    }
    for f, (r0, r1) in expect.items():
        torch.testing.assert_close(got[f][0], r0, msg=f"feature {f} line 0")
        torch.testing.assert_close(got[f][1], r1, msg=f"feature {f} line 1")
    assert vocabs[0][h(t["a"])] == 0 and h(t["d"]) not in vocabs[0]  # truncated tokens make no rows


def test_sparse_gradients_of_sum_and_mean(tmp_path):
    spec = loads_spec(spec_text(['column = "C1"\ntable = "a"\ntokens = 4\npooling = "mean"',
                                 'column = "C2"\ntable = "a"\ntokens = 4'], sparse="dim = 4"))
    path = tmp_path / "g.tsv"
    path.write_text(tsv_line(1, {1: f"{TOK['a']}|{TOK['b']}", 2: f"{TOK['a']}|{TOK['a']}"}) + "\n")
    layout = sdata.Layout(spec)
    vocabs = [dict()]
    raw = sdata.parse_file(str(path), layout, vocabs)
    offsets, rows = layout.table_offsets([len(vocabs[0])])
    model = SpecDlrm(layout, rows, torch.Generator().manual_seed(0), 0.1)
    pooled = model.pooled(sdata.finalize(raw, layout, offsets).batch(0, 1))
    (pooled[0].sum() * 1.0 + pooled[1].sum() * 10.0).backward()  # calls: mean (C1), sum (C2)
    g = model.emb[0].weight.grad.coalesce().to_dense()
    # row a: 1/2 from the mean bag + 2 * 10 from the sum bag; row b: 1/2
    torch.testing.assert_close(g[0], torch.full((4,), 20.5))
    torch.testing.assert_close(g[1], torch.full((4,), 0.5))


# ---- DCN ----


def cross_plain(x0, vs, us, bs):
    """x_{l+1} = x0 * (U (V x_l) + b) + x_l with explicit loops over samples, ranks and columns (float64)."""
    out = []
    for s in range(len(x0)):
        x = list(x0[s])
        for V, U, b in zip(vs, us, bs):
            r = [sum(V[k][j] * x[j] for j in range(len(x))) for k in range(len(V))]
            y = [sum(U[i][k] * r[k] for k in range(len(r))) + b[i] for i in range(len(x))]
            x = [x0[s][i] * y[i] + x[i] for i in range(len(x))]
        out.append(x)
    return np.array(out)


def test_cross_net_matches_plain_loop():
    gen = torch.Generator().manual_seed(3)
    net = LowRankCrossNet(7, 3, 2, gen).double()
    x0 = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    p = lambda m: m.detach().numpy().tolist()
    want = cross_plain(x0.numpy().tolist(), [p(v.weight) for v in net.v], [p(u.weight) for u in net.u],
                       [p(u.bias) for u in net.u])
    np.testing.assert_allclose(net(x0).detach().numpy(), want, rtol=1e-12, atol=1e-12)
    # init: V and U normal(0, sqrt(2 / (7 + 2))), U's bias normal(0, sqrt(1 / 7)); no V bias
    assert net.v[0].bias is None and net.u[0].bias.shape == (7,)


def test_dcn_model_feeds_x0_in_spec_order(tmp_path):
    """Features in two weight groups (dims 2 and 3) and both poolings, listed interleaved: x0 must still be
    [z, e_1, ..., e_F] in spec order, and the top MLP reads x_L."""
    spec = loads_spec(spec_text(
        ['column = "C3"\ntable = "p"\ndim = 2\ntokens = 2', 'column = "C1"\ntable = "q"\ndim = 3',
         'column = "C2"\ntable = "r"\ndim = 2\ntokens = 2\npooling = "mean"', 'column = "C4"\ntable = "s"\ndim = 3'],
        interaction='kind = "dcn"\nlayers = 2\nrank = 3', bottom="[5, 4]", top="[6, 1]"))
    rows = [tsv_line(i % 2, {3: f"{TOK['a']}|{TOK['b']}", 1: TOK["c"] if i else "", 2: TOK["d"], 4: TOK["e"]})
            for i in range(3)]
    path = tmp_path / "d.tsv"
    path.write_text("\n".join(rows) + "\n")
    layout = sdata.Layout(spec)
    assert [c.features for c in layout.calls] == [[0], [1, 3], [2]]  # so a permutation is needed
    vocabs = [dict() for _ in spec.tables]
    raw = sdata.parse_file(str(path), layout, vocabs)
    offsets, group_rows = layout.table_offsets([len(v) for v in vocabs])
    bags = sdata.finalize(raw, layout, offsets).batch(0, 3)
    model = SpecDlrm(layout, group_rows, torch.Generator().manual_seed(1), 0.3)
    assert model.permute and spec.interaction_width == 4 + 2 + 3 + 2 + 3
    dense = torch.from_numpy(raw.dense)
    with torch.no_grad():
        per_feature = {}
        for c, p in zip(layout.calls, model.pooled(bags)):
            for k, f in enumerate(c.features):
                per_feature[f] = p[:, k, :]
        x0 = torch.cat([model.bottom(dense)] + [per_feature[f] for f in range(4)], dim=1).double()
        p = lambda m: m.detach().double().numpy().tolist()
        xl = cross_plain(x0.numpy().tolist(), [p(v.weight) for v in model.cross.v],
                         [p(u.weight) for u in model.cross.u], [p(u.bias) for u in model.cross.u])
        want = model.top(torch.from_numpy(xl).float()).squeeze(1)
        torch.testing.assert_close(model(dense, bags), want, rtol=1e-5, atol=1e-5)


def test_dot_model_with_two_groups_matches_manual(tmp_path):
    spec = loads_spec(spec_text(['column = "C1"\ntable = "a"\nlr = 0.1', 'column = "C2"\ntable = "b"',
                                 'column = "C3"\ntable = "c"\nlr = 0.1\ntokens = 3\npooling = "mean"']))
    path = tmp_path / "t.tsv"
    path.write_text("\n".join(tsv_line(1, {1: TOK["a"], 2: TOK["b"], 3: f"{TOK['c']}|{TOK['d']}"}) for _ in range(2)))
    layout = sdata.Layout(spec)
    vocabs = [dict() for _ in spec.tables]
    raw = sdata.parse_file(str(path), layout, vocabs)
    offsets, group_rows = layout.table_offsets([len(v) for v in vocabs])
    bags = sdata.finalize(raw, layout, offsets).batch(0, 2)
    model = SpecDlrm(layout, group_rows, torch.Generator().manual_seed(2), 0.3)
    dense = torch.from_numpy(raw.dense)
    with torch.no_grad():
        e = {}
        for c, p in zip(layout.calls, model.pooled(bags)):
            for k, f in enumerate(c.features):
                e[f] = p[:, k, :]
        x = model.bottom(dense)
        t = [x, e[0], e[1], e[2]]
        pairs = [(t[i] * t[j]).sum(1) for i in range(4) for j in range(i)]
        want = model.top(torch.cat([x] + [q.unsqueeze(1) for q in pairs], 1)).squeeze(1)
        torch.testing.assert_close(model(dense, bags), want)


# ---- training ----


def test_training_steps_lower_the_loss(tmp_path):
    path = tmp_path / "train.tsv"
    multihot_data.write(path, MLPERF_TOKENS, 512, seed=5)
    spec = load_spec("dlrm-v2-small")
    layout = sdata.Layout(spec)
    vocabs = [dict() for _ in spec.tables]
    raw = sdata.parse_file(str(path), layout, vocabs)
    assert sum(raw.truncated) > 0 and raw.bad == 0
    offsets, group_rows = layout.table_offsets([len(v) for v in vocabs])
    bags = sdata.finalize(raw, layout, offsets)
    torch.manual_seed(0)
    model = SpecDlrm(layout, group_rows, torch.Generator().manual_seed(0), 0.05)
    sys.path.insert(0, str(BENCH))
    import dlrm_reference as ref

    dense_params = [p for n, p in model.named_parameters() if not n.startswith("emb.")]
    opt = torch.optim.Adagrad(dense_params, lr=0.05, eps=1e-8, initial_accumulator_value=0.0)
    emb = ref.EmbOptimizers([ref.emb_optimizer(g.optimizer, e.weight, 0.05) for g, e in zip(layout.groups, model.emb)])
    y, d = torch.from_numpy(raw.labels), torch.from_numpy(raw.dense)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def loss():
        with torch.no_grad():
            return loss_fn(model(d, bags.batch(0, 512)), y).item()

    before = loss()
    for _ in range(5):
        for s in range(0, 512, 128):
            opt.zero_grad(set_to_none=True)
            emb.zero_grad()
            loss_fn(model(d[s : s + 128], bags.batch(s, s + 128)), y[s : s + 128]).backward()
            opt.step()
            emb.step()
    after = loss()
    assert after < before - 0.02, (before, after)


@pytest.mark.parametrize("bf16", [False, True])
def test_command_line_trains_a_spec(tmp_path, bf16):
    train, test, out = tmp_path / "train.tsv", tmp_path / "test.tsv", tmp_path / "out.json"
    multihot_data.write(train, MLPERF_TOKENS, 300, seed=1)
    multihot_data.write(test, MLPERF_TOKENS, 100, seed=2)
    run_main(["--train", train, "--test", test, "--model-spec", "dlrm-v2-small", "--batch-size", "128", "--threads",
              "1", "--json", out] + (["--bf16"] if bf16 else []))
    s = json.loads(out.read_text())
    assert s["model_spec"] == "dlrm-v2-small" and s["interaction"] == "dcn" and s["samples"] == 300
    assert s["optimizer"] == "adagrad" and s["dense_optimizer"] == "adagrad" and s["test_samples"] == 100
    assert s["precision"] == ("bf16 autocast" if bf16 else "f32")
    assert math.isfinite(s["logloss"]) and 0 <= s["auc"] <= 1 and s["tokens_truncated"]["C21"] > 0


def test_command_line_refuses_a_bad_spec(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(spec_text(one_per_column(3) + ['column = "C4"\ntable = "C4"\ndim = 0']))
    with pytest.raises(SystemExit) as e:
        run_main(["--train", os.devnull, "--test", os.devnull, "--model-spec", bad])
    assert "feature[3] (C4).dim: must be at least 1" in str(e.value.code)
    with pytest.raises(SystemExit) as e:
        run_main(["--train", os.devnull, "--test", os.devnull, "--model-spec", "dlrm-kaggle", "--optimizer", "sgd"])
    assert e.value.code == 2 and "--optimizer conflicts with --model-spec" in capsys.readouterr().err
    r = subprocess.run([sys.executable, str(BENCH / "dlrm_reference.py"), "--train", os.devnull, "--test",
                        os.devnull, "--model-spec", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "feature[3] (C4).dim: must be at least 1" in r.stderr  # the script as run


def test_kaggle_spec_reproduces_the_run_without_a_spec(tmp_path):
    """dlrm-kaggle is today's model: same rows, same initial draws, same updates, so the same numbers."""
    train, test = tmp_path / "train.tsv", tmp_path / "test.tsv"
    multihot_data.write(train, [1] * 26, 300, seed=3)
    multihot_data.write(test, [1] * 26, 100, seed=4)
    got = []
    for extra in ([], ["--model-spec", "dlrm-kaggle"]):
        out = tmp_path / f"out{len(extra)}.json"
        run_main(["--train", train, "--test", test, "--batch-size", "128", "--threads", "1", "--json", out] + extra)
        got.append(json.loads(out.read_text()))
    for k in ("train_loss", "auc", "logloss", "calibration", "optimizer", "dense_optimizer", "samples"):
        assert got[0][k] == got[1][k], k
    assert "model_spec" not in got[0] and got[1]["model_spec"] == "dlrm-kaggle"
