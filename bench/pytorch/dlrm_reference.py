#!/usr/bin/env python3
"""PyTorch reference of the DLRM the `trainer` crate trains, on the same Criteo-format data.

Same model (model/src/config.rs defaults):
  dense   : I1..I13 -> ln(1 + max(x, 0)), empty -> 0                       (trainer/src/criteo/parse.rs)
  bottom  : 13 -> 512 -> 256 -> 64 -> 16, ReLU after every layer
  sparse  : 26 tables of dim 16, one row per distinct (feature, token) pair; an empty field is its own token
  interact: the 351 pairwise dot products among [bottom output, e1..e26] (strict lower triangle), concatenated
            with the bottom output -> 367
  top     : 367 -> 512 -> 256 -> 1, ReLU except the last; loss: mean binary cross-entropy on the logit
  init    : linear weights normal(0, sqrt(2 / (in + out))), biases normal(0, sqrt(1 / out)) (the DLRM reference's
            init, as model/src/linear.rs); embedding rows uniform(-0.05, 0.05)

Same hashing. The trainer maps (feature f, token t) to a 64-bit id with a bijective mix (trainer/src/criteo/ids.rs),
so distinct pairs never collide and every pair gets its own server-side row, created on first push; a row never
trained reads as its initializer. Here each (f, t) pair seen in the train or test file gets its own row of one
concatenated embedding table (a per-feature dictionary, also collision-free); rows only the test file uses are
never trained and keep their initial values, as on the parameter servers.

Same optimizers, same hyper-parameters as the trainer's defaults (trainer/src/config.rs):
  --optimizer sgd      : embedding rows w -= 0.5 * g (sparse gradients)
  --optimizer adagrad  : row-wise Adagrad, acc += mean(g^2), w -= 0.05 * g / (sqrt(acc) + 1e-8)
  --dense-optimizer sgd (lr 0.1) | adagrad (lr 0.005, eps 1e-8) | adam (lr 0.002, betas 0.9/0.999, eps 1e-8);
  the default dense optimizer follows the trainer: adam with --optimizer adagrad, sgd with --optimizer sgd.
  g is the gradient of the batch's mean loss, as the trainer pushes it (loss-scaled on the wire, unscaled on
  the server).

--bf16 runs the forward passes under torch.autocast("cpu", dtype=torch.bfloat16): PyTorch's own CPU mixed
precision (oneDNN runs the linear layers in bf16, on AMX tiles where the CPU has them), to compare with the
trainer's --dense-precision bf16. The default is f32, as the trainer's default.

Only the training loop is timed (data is parsed and moved into tensors first); samples/s is one pass over the
training file at --batch-size. Test AUC is exact (ties get average ranks), logloss is mean binary cross-entropy.

--model-spec FILE.toml (or a shipped spec's NAME: model/specs/NAME.toml) trains the model a spec describes
(docs/model-spec.md; the dlrmspec package next to this file): per-feature tables, dims, pooling, multi-hot token
caps, hash sizes, per-table optimizers and rates, `dot` or `dcn` interaction, MLP sizes, the dense optimizer of its
[dense] section (else the flags). Multi-hot fields hold tokens separated by `|` and are looked up with
F.embedding_bag (sum or mean, sparse gradients). The spec decides what --optimizer and --emb-lr decide without one
(they are refused with it); encodings are accepted and ignored (no wire here). The dlrm-kaggle spec is the model
above and draws the same initial weights.

Usage: dlrm_reference.py --train data/demo/train-1000000-s1-t7.tsv --test data/demo/test-100000-s2-t7.tsv
       [--optimizer sgd|adagrad] [--dense-optimizer sgd|adagrad|adam] [--threads 2] [--bf16] [--json out.json]
       [--model-spec model/specs/dlrm-v2.toml]
"""

import argparse
import json
import math
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn as nn
except ImportError as e:  # the comparison script checks this first; this is for direct use
    sys.exit(f"dlrm_reference.py needs PyTorch and numpy ({e}); install with: python3 -m pip install torch numpy")

from dlrmspec import data as spec_data
from dlrmspec.model import SpecDlrm, mlp
from dlrmspec.spec import SpecError, load_spec

NUM_DENSE = 13
NUM_SPARSE = 26
EMB_DIM = 16
BOTTOM = [512, 256, 64, 16]
TOP = [512, 256, 1]


def parse(path, vocabs):
    """Reads a Criteo TSV (label, I1..I13, C1..C26; trailing empty fields may be stripped).

    Returns labels [n] float32, dense [n, 13] float32 (ln(1 + max(x, 0))), and sparse [n, 26] int64 indices into
    the per-feature dictionaries `vocabs` (extended in place)."""
    labels, dense, sparse = [], [], []
    bad = 0
    with open(path, "r", encoding="ascii", newline="") as f:
        for line in f:
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) < 1 + NUM_DENSE + NUM_SPARSE:
                fields += [""] * (1 + NUM_DENSE + NUM_SPARSE - len(fields))
            try:
                y = int(fields[0])
                d = [math.log1p(max(int(x), 0)) if x else 0.0 for x in fields[1 : 1 + NUM_DENSE]]
            except ValueError:
                bad += 1
                continue
            row = []
            for j, tok in enumerate(fields[1 + NUM_DENSE : 1 + NUM_DENSE + NUM_SPARSE]):
                v = vocabs[j]
                idx = v.get(tok)
                if idx is None:
                    idx = len(v)
                    v[tok] = idx
                row.append(idx)
            labels.append(y)
            dense.append(d)
            sparse.append(row)
    if bad:
        print(f"{path}: skipped {bad} malformed lines", file=sys.stderr)
    return (
        np.asarray(labels, dtype=np.float32),
        np.asarray(dense, dtype=np.float32),
        np.asarray(sparse, dtype=np.int64),
    )


class Dlrm(nn.Module):
    def __init__(self, rows, offsets, gen, init_scale):
        super().__init__()
        self.bottom = mlp([NUM_DENSE] + BOTTOM, True, gen)
        n = NUM_SPARSE + 1
        self.top = mlp([EMB_DIM + n * (n - 1) // 2] + TOP, False, gen)
        self.emb = nn.Embedding(rows, EMB_DIM, sparse=True)
        with torch.no_grad():
            self.emb.weight.uniform_(-init_scale, init_scale, generator=gen)
        self.register_buffer("offsets", torch.as_tensor(offsets, dtype=torch.int64))
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)

    def forward(self, dense, sparse):
        x = self.bottom(dense)  # [b, 16]
        e = self.emb(sparse + self.offsets)  # [b, 26, 16]
        t = torch.cat([x.unsqueeze(1), e], dim=1)  # [b, 27, 16]
        z = torch.bmm(t, t.transpose(1, 2))  # [b, 27, 27]
        pairs = z[:, self.li, self.lj]  # [b, 351]
        return self.top(torch.cat([x, pairs], dim=1)).squeeze(1)


class RowAdagrad:
    """Row-wise Adagrad on a sparse embedding gradient (what the parameter servers run)."""

    def __init__(self, weight, lr, eps=1e-8):
        self.weight, self.lr, self.eps = weight, lr, eps
        self.acc = torch.zeros(weight.shape[0])

    @torch.no_grad()
    def step(self):
        g = self.weight.grad.coalesce()
        idx, vals = g.indices()[0], g.values()
        acc = self.acc.index_add_(0, idx, vals.pow(2).mean(1))[idx]
        self.weight.index_add_(0, idx, vals * (-self.lr / (acc.sqrt() + self.eps)).unsqueeze(1))

    def zero_grad(self):
        self.weight.grad = None


class EmbOptimizers:
    """One embedding optimizer per weight group of a spec (sgd or row-wise adagrad, each with its lr)."""

    def __init__(self, opts):
        self.opts = opts

    def step(self):
        for o in self.opts:
            o.step()

    def zero_grad(self):
        for o in self.opts:
            o.zero_grad()


def emb_optimizer(kind, weight, lr):
    return torch.optim.SGD([weight], lr=lr) if kind == "sgd" else RowAdagrad(weight, lr)


def exact_auc(labels, scores):
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), dtype=np.float64)
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i : j + 1] = (i + j) / 2.0 + 1.0
        i = j + 1
    y = labels[order]
    pos = y.sum()
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--model-spec", help="a model spec TOML file or a shipped spec's name (docs/model-spec.md)")
    ap.add_argument("--optimizer", choices=["sgd", "adagrad"], help="embedding optimizer (default adagrad)")
    ap.add_argument("--dense-optimizer", choices=["sgd", "adagrad", "adam"])
    ap.add_argument("--lr", type=float, help="dense learning rate (default per optimizer, as the trainer)")
    ap.add_argument("--emb-lr", type=float, help="embedding learning rate (default per optimizer)")
    ap.add_argument("--emb-init-scale", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--bf16", action="store_true", help="forward passes under CPU bf16 autocast")
    ap.add_argument("--json", help="write the summary here")
    a = ap.parse_args()
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16)

    spec = None
    if a.model_spec:
        for flag in ("optimizer", "emb_lr"):
            if getattr(a, flag) is not None:
                ap.error(f"--{flag.replace('_', '-')} conflicts with --model-spec (the spec sets each table's)")
        try:
            spec = load_spec(a.model_spec)
        except (SpecError, OSError) as e:
            sys.exit(f"dlrm_reference.py: bad --model-spec: {e}")
    if a.optimizer is None:
        a.optimizer = "adagrad"

    torch.set_num_threads(a.threads)
    if spec is None:
        dense_kind = a.dense_optimizer or ("adam" if a.optimizer == "adagrad" else "sgd")
        lr = a.lr if a.lr is not None else {"adam": 0.002, "adagrad": 0.005, "sgd": 0.1}[dense_kind]
    else:  # the spec's [dense], else the flags (whose default follows the [sparse] optimizer, as --optimizer's)
        default = "adam" if spec.sparse_optimizer == "adagrad" else "sgd"
        dense_kind = spec.dense_optimizer or a.dense_optimizer or default
        lr = spec.dense_lr if spec.dense_lr is not None else a.lr
        if lr is None:
            lr = {"adam": 0.002, "adagrad": 0.005, "sgd": 0.1}[dense_kind]
    emb_lr = a.emb_lr if a.emb_lr is not None else {"adagrad": 0.05, "sgd": 0.5}[a.optimizer]

    t0 = time.time()
    gen = torch.Generator().manual_seed(a.seed)
    truncated = None
    if spec is None:
        vocabs = [dict() for _ in range(NUM_SPARSE)]
        ytr, dtr, str_ = parse(a.train, vocabs)
        yte, dte, ste = parse(a.test, vocabs)
        sizes = [len(v) for v in vocabs]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        print(
            f"parsed {len(ytr)} train / {len(yte)} test rows, {sum(sizes)} embedding rows in {time.time() - t0:.1f} s",
            file=sys.stderr,
        )
        model = Dlrm(sum(sizes), offsets, gen, a.emb_init_scale)
        emb_opt = (
            torch.optim.SGD([model.emb.weight], lr=emb_lr)
            if a.optimizer == "sgd"
            else RowAdagrad(model.emb.weight, emb_lr)
        )
        str_t, ste_t = torch.from_numpy(str_), torch.from_numpy(ste)
        train_sparse = lambda s, e: str_t[s:e]
        test_sparse = lambda s, e: ste_t[s:e]
        emb_kind = a.optimizer
    else:
        layout = spec_data.Layout(spec)
        tr, trb, te, teb, group_rows = spec_data.load(a.train, a.test, layout)
        ytr, dtr, yte, dte = tr.labels, tr.dense, te.labels, te.dense
        truncated = {spec.features[i].name: n for i, n in enumerate(tr.truncated) if n}
        tokens = sum(len(i) for i in trb.idx)
        print(
            f"spec {spec.name}: parsed {len(ytr)} train / {len(yte)} test rows ({tokens / max(len(ytr), 1):.1f} "
            f"tokens per train row, {sum(tr.truncated)} truncated), {sum(group_rows)} embedding rows in "
            f"{len(group_rows)} weight(s) in {time.time() - t0:.1f} s",
            file=sys.stderr,
        )
        model = SpecDlrm(layout, group_rows, gen, a.emb_init_scale)
        emb_opt = EmbOptimizers(
            [emb_optimizer(g.optimizer, e.weight, g.lr) for g, e in zip(layout.groups, model.emb)]
        )
        train_sparse, test_sparse = trb.batch, teb.batch
        kinds = sorted({g.optimizer for g in layout.groups})
        emb_kind = kinds[0] if len(kinds) == 1 else "/".join(kinds)

    dense_params = [p for n, p in model.named_parameters() if not n.startswith("emb.")]
    if dense_kind == "sgd":
        dense_opt = torch.optim.SGD(dense_params, lr=lr)
    elif dense_kind == "adagrad":
        dense_opt = torch.optim.Adagrad(dense_params, lr=lr, eps=1e-8, initial_accumulator_value=0.0)
    else:
        dense_opt = torch.optim.Adam(dense_params, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = nn.BCEWithLogitsLoss()

    ytr_t, dtr_t = torch.from_numpy(ytr), torch.from_numpy(dtr)
    n = len(ytr)
    b = a.batch_size
    losses = []
    start = time.perf_counter()
    for s in range(0, n, b):
        dense_opt.zero_grad(set_to_none=True)
        emb_opt.zero_grad()
        with autocast():
            logit = model(dtr_t[s : s + b], train_sparse(s, s + b))
        loss = loss_fn(logit.float(), ytr_t[s : s + b])
        loss.backward()
        dense_opt.step()
        emb_opt.step()
        losses.append((loss.item(), min(b, n - s)))
    seconds = time.perf_counter() - start

    tail = losses[-max(1, len(losses) // 10) :]
    train_loss = sum(l * k for l, k in tail) / sum(k for _, k in tail)
    with torch.no_grad(), autocast():
        logits = torch.cat(
            [
                model(torch.from_numpy(dte[s : s + 8192]), test_sparse(s, s + 8192))
                for s in range(0, len(yte), 8192)
            ]
        ).float().double()
    p = torch.sigmoid(logits).clamp(1e-7, 1 - 1e-7).numpy()
    logloss = float(-np.mean(yte * np.log(p) + (1 - yte) * np.log(1 - p)))
    summary = {
        "framework": f"pytorch {torch.__version__}",
        "threads": a.threads,
        "precision": "bf16 autocast" if a.bf16 else "f32",
        "optimizer": emb_kind,
        "dense_optimizer": dense_kind,
        "batch_size": b,
        "samples": n,
        "seconds": seconds,
        "samples_per_sec": n / seconds,
        "train_loss": train_loss,
        "auc": exact_auc(yte, logits.numpy()),
        "logloss": logloss,
        "calibration": float(p.mean() / max(yte.mean(), 1e-12)),
        "test_samples": int(len(yte)),
        # Every step's training loss, to compare the first steps' trajectory with the trainer's
        # (`trainer demo --progress-secs 0.0001` prints one progress line per step).
        "step_losses": [l for l, _ in losses],
    }
    if spec is not None:
        summary["model_spec"] = spec.name
        summary["interaction"] = spec.interaction
        summary["tokens_truncated"] = truncated
    print(
        (f"pytorch ({spec.name}): " if spec is not None else "pytorch: ")
        + f"{summary['samples_per_sec']:.0f} samples/s over {seconds:.2f} s, train loss {train_loss:.4f}, "
        f"test AUC {summary['auc']:.4f}, logloss {logloss:.4f}, calibration {summary['calibration']:.3f}"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
