"""``python -m pstrain.demo``: DLRM whose dense layers are plain PyTorch and whose 26 embedding tables live on a
local cluster of pstrain parameter servers.

The same data, model and defaults as ``trainer demo`` (generated Criteo rows with a planted click model; bottom
MLP 13-512-256-64-16, pairwise dot interaction, top MLP 367-512-256-1; row-wise Adagrad rows (lr 0.05, uniform
init 0.05) on the servers, f16 on the wire; dense Adam lr 0.002 with the last 20% of the pass annealed as
(1 - t/N)^2; the output bias started at the first batch's positive rate), so the two can be compared. Prints
and (``--summary-json``) writes ``samples``, ``seconds``, ``samples_per_sec``, ``auc``, ``logloss`` and the
per-batch time spent in pulls, pushes and waiting.

``--local-embeddings`` trains the same model with local ``nn.EmbeddingBag`` tables instead (the baseline).
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

from . import Client, LocalCluster
from .data import NUM_DENSE, NUM_SPARSE, generate, read_criteo
from .torch import EmbeddingCollection, EmbeddingTable, JaggedFeatures

KEYS = [f"C{i + 1}" for i in range(NUM_SPARSE)]


def mlp(sizes, last_relu, gen):
    layers = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        with torch.no_grad():
            lin.weight.normal_(0.0, math.sqrt(2.0 / (sizes[i] + sizes[i + 1])), generator=gen)
            lin.bias.normal_(0.0, math.sqrt(1.0 / sizes[i + 1]), generator=gen)
        layers.append(lin)
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseDlrm(nn.Module):
    """DLRM's dense part: bottom MLP, dot interaction over [bottom, e_1..e_26], top MLP."""

    def __init__(self, dim, gen):
        super().__init__()
        self.bottom = mlp([NUM_DENSE, 512, 256, 64, dim], True, gen)
        n = NUM_SPARSE + 1
        self.top = mlp([dim + n * (n - 1) // 2, 512, 256, 1], False, gen)
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)

    def forward(self, dense, emb):  # emb: [b, 26, dim]
        x = self.bottom(dense)
        t = torch.cat([x.unsqueeze(1), emb], dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        return self.top(torch.cat([x, z[:, self.li, self.lj]], dim=1)).squeeze(1)


class LocalTables(nn.Module):
    """The baseline: one local ``nn.EmbeddingBag`` per feature over the ids seen, row-wise Adagrad by hand."""

    def __init__(self, ids_seen, dim, init_scale, lr, gen):
        super().__init__()
        self.vocab = [np.unique(ids_seen[:, k]) for k in range(NUM_SPARSE)]
        self.bags = nn.ModuleList(nn.EmbeddingBag(len(v), dim, mode="sum", sparse=True) for v in self.vocab)
        self.acc = [torch.zeros(len(v)) for v in self.vocab]
        self.lr = lr
        with torch.no_grad():
            for b in self.bags:
                b.weight.uniform_(-init_scale, init_scale, generator=gen)

    def index(self, ids):
        return [torch.from_numpy(np.searchsorted(self.vocab[k], ids[:, k]).astype(np.int64)) for k in range(NUM_SPARSE)]

    def forward(self, idx):
        return torch.stack([bag(i.unsqueeze(1)) for bag, i in zip(self.bags, idx)], dim=1)

    @torch.no_grad()
    def step(self):
        for bag, acc in zip(self.bags, self.acc):
            g = bag.weight.grad.coalesce()
            i, v = g.indices()[0], g.values()
            a = acc.index_add_(0, i, v.pow(2).mean(1))[i]
            bag.weight.index_add_(0, i, v * (-self.lr / (a.sqrt() + 1e-8)).unsqueeze(1))
            bag.weight.grad = None


def exact_auc(labels, scores):
    order = np.argsort(scores, kind="mergesort")
    s, y = scores[order], labels[order]
    # Average ranks over ties.
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    ranks = np.repeat(first + (counts + 1) / 2.0, counts)
    pos = y.sum()
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def logit_shift_to_rate(logits, rate):
    """The shift d with mean(sigmoid(logits + d)) = rate (Newton), as trainer's --init-output-bias."""
    rate = min(max(rate, 1e-4), 1 - 1e-4)
    z = logits.double()
    d = 0.0
    for _ in range(50):
        s = torch.sigmoid(z + d)
        f, df = float(s.mean()) - rate, float((s * (1 - s)).mean())
        if abs(f) < 1e-7 or df < 1e-12:
            break
        d = min(max(d - f / df, -30.0), 30.0)
    return d


def tb_progress(tb, step, mark, losses, stats):
    """Writes the training loss and samples/s since the last point, and (through the servers) the pull, push
    and wait milliseconds per step; returns the new mark."""
    now = time.perf_counter()
    t0, step0, stats0 = mark
    recent = losses[step0:step]
    n = sum(k for _, k in recent)
    values = {
        "train/loss": sum(l * k for l, k in recent) / max(n, 1),
        "train/samples_per_sec": n / max(now - t0, 1e-9),
    }
    if stats:
        for key, tag in (("pull_seconds", "pull"), ("push_seconds", "push"), ("layer_wait_seconds", "wait")):
            values[f"time/{tag}_ms"] = (stats[key] - stats0.get(key, 0.0)) / max(step - step0, 1) * 1e3
    tb.scalars(step, values)
    return now, step, stats or {}


def _capped_rows(cluster) -> int:
    """Rows the servers deleted past their caps (``ps_rows_capped_total`` on each one's /metrics)."""
    import urllib.request

    total = 0
    for addr in cluster.metrics:
        url = addr if addr.startswith("http") else f"http://{addr}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("ps_rows_capped_total "):
                    total += int(float(line.split()[1]))
    return total


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pstrain.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="training rows to generate")
    ap.add_argument("--test-rows", type=int, default=100_000)
    ap.add_argument("--train", help="train on this Criteo file instead (with --test)")
    ap.add_argument("--test", help="evaluate on this Criteo file")
    ap.add_argument("--data-dir", default="data/demo", help="generated data (reused when present)")
    ap.add_argument("--data-seed", type=int, default=1)
    ap.add_argument("--teacher-seed", type=int, default=7)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--emb-dim", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.002, help="dense Adam learning rate")
    ap.add_argument("--emb-lr", type=float, default=0.05, help="row-wise Adagrad learning rate of the rows")
    ap.add_argument("--emb-init-scale", type=float, default=0.05)
    ap.add_argument("--encoding", default="f16", choices=["f32", "f16", "bf16"])
    ap.add_argument("--staleness", type=int, default=0,
                    help="updates whose pushes may be unacknowledged while a step computes (0: none); the "
                         "collection replays its own pushes, so the rows (and AUC) do not depend on it")
    ap.add_argument("--no-prefetch", action="store_true", help="pull each batch only when it is needed")
    ap.add_argument("--lr-decay-fraction", type=float, default=0.2)
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--local-embeddings", action="store_true", help="baseline: local nn.EmbeddingBag tables")
    ap.add_argument("--row-cap-fraction", type=float,
                    help="cap each table of 1,000 or more distinct training ids at this fraction of them (per server: "
                         "ceil(ids x fraction / servers)); an expiry pass every --expire-interval-secs deletes past it")
    ap.add_argument("--eviction", default="lfu", choices=["lfu", "score-seen", "score-clicks"],
                    help="with --row-cap-fraction, what the cap deletes first: the least frequently updated rows "
                         "(lfu), or the lowest scored, each batch adding to its ids' scores 1 per occurrence "
                         "(score-seen) or 1 per occurrence in a clicked sample (score-clicks)")
    ap.add_argument("--decay-secs", type=int, default=10, help="counts and scores halve this often")
    ap.add_argument("--expire-interval-secs", type=float, default=1.0)
    ap.add_argument("--summary-json")
    ap.add_argument("--tensorboard-dir", help="write TensorBoard event files here (pstrain.tensorboard)")
    ap.add_argument("--progress-secs", type=float, default=2.0, help="seconds between TensorBoard points")
    a = ap.parse_args(argv)
    if (a.train is None) != (a.test is None):
        ap.error("--train and --test go together")
    if a.row_cap_fraction is not None and not 0 < a.row_cap_fraction <= 1:
        ap.error(f"--row-cap-fraction {a.row_cap_fraction}: expected a fraction in (0, 1]")
    if a.row_cap_fraction is not None and a.local_embeddings:
        ap.error("--row-cap-fraction caps the servers' tables: not with --local-embeddings")
    torch.set_num_threads(a.threads)
    tb = None
    if a.tensorboard_dir:
        from .tensorboard import EventWriter

        tb = EventWriter(a.tensorboard_dir)  # before any work: a bad directory fails at once

    if a.train:
        train_path, test_path = a.train, a.test
    else:
        d = a.data_dir
        train_path = generate(a.rows, f"{d}/train-{a.rows}-s{a.data_seed}-t{a.teacher_seed}.tsv", a.data_seed, a.teacher_seed)
        test_path = generate(a.test_rows, f"{d}/test-{a.test_rows}-s{a.data_seed + 1}-t{a.teacher_seed}.tsv",
                             a.data_seed + 1, a.teacher_seed)
    t0 = time.time()
    ytr, dtr, itr = read_criteo(train_path)
    yte, dte, ite = read_criteo(test_path)
    print(f"read {len(ytr)} train / {len(yte)} test rows in {time.time() - t0:.1f} s", file=sys.stderr)

    gen = torch.Generator().manual_seed(a.seed)
    dense = DenseDlrm(a.emb_dim, gen)
    opt = torch.optim.Adam(dense.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    n, b = len(ytr), a.batch_size
    steps = (n + b - 1) // b
    decay_steps = int(round(steps * a.lr_decay_fraction))
    decay_start = steps - decay_steps
    loss_fn = nn.BCEWithLogitsLoss()

    cluster = client = None
    caps, scored, score_seconds, score_found, score_sent = {}, [], 0.0, 0, 0
    if a.local_embeddings:
        local = LocalTables(np.concatenate([itr, ite]), a.emb_dim, a.emb_init_scale, a.emb_lr, gen)
        lookup = lambda s, e: local(local.index(itr[s:e]))
        lookup_eval = lambda ids: local(local.index(ids))
    else:
        extra = []
        if a.row_cap_fraction is not None:
            extra = ["--expire-interval-secs", str(a.expire_interval_secs)]
            for k_i, k in enumerate(KEYS):
                distinct = len(np.unique(itr[:, k_i]))
                if distinct >= 1000:
                    caps[k] = {"policy": "lfu" if a.eviction == "lfu" else "score",
                               "max_rows": max(1, math.ceil(distinct * a.row_cap_fraction / a.servers)),
                               "decay_secs": a.decay_secs}
        cluster = LocalCluster(a.servers, extra_args=extra)
        client = Client(cluster.servers, cluster.tls_dir)
        tables = [
            EmbeddingTable(k, a.emb_dim, optimizer="row_adagrad", lr=a.emb_lr,
                           options=dict(init="uniform", init_scale=a.emb_init_scale, seed=k_i + 1,
                                        encoding=a.encoding, **({"eviction": caps[k]} if k in caps else {})))
            for k_i, k in enumerate(KEYS)
        ]
        scored = [(k_i, k) for k_i, k in enumerate(KEYS) if k in caps] if a.eviction != "lfu" else []
        emb = EmbeddingCollection(client, tables, staleness=a.staleness)
        batch = lambda s, e: JaggedFeatures.from_dense(KEYS, itr[s:e])
        stack = lambda feats: emb(feats, stack=True)
    ytr_t, dtr_t = torch.from_numpy(ytr), torch.from_numpy(dtr)

    losses = []
    try:
        start = time.perf_counter()
        mark = (start, 0, {})  # time, step and client counters at the last TensorBoard point
        nxt = None if a.local_embeddings else batch(0, min(b, n))
        for step in range(steps):
            s, e = step * b, min(n, (step + 1) * b)
            for g in opt.param_groups:
                done = min(max(step + 1 - decay_start, 0), decay_steps) / decay_steps if decay_steps else 0.0
                g["lr"] = a.lr * (1.0 - done) ** 2
            if a.local_embeddings:
                e_rows = lookup(s, e)
            else:
                cur = nxt
                e_rows = stack(cur)
                if e < n:
                    # The next batch's pull overlaps this one's compute and push.
                    nxt = batch(e, min(n, e + b))
                    if not a.no_prefetch:
                        emb.prefetch(nxt)
            logit = dense(dtr_t[s:e], e_rows)
            if step == 0:
                with torch.no_grad():
                    dense.top[-1].bias += logit_shift_to_rate(logit.detach(), float(ytr_t[s:e].mean()))
                logit = dense(dtr_t[s:e], e_rows)
            loss = loss_fn(logit, ytr_t[s:e]) * ((e - s) / b)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if a.local_embeddings:
                local.step()
            losses.append((float(loss.detach()) * b / (e - s), e - s))
            if scored and step > 0:
                # The previous batch's ids (their pushes have created their rows by now, mostly: an id without a
                # row is not scored).
                t_score = time.perf_counter()
                ps, pe = (step - 1) * b, step * b
                rows = slice(ps, pe) if a.eviction == "score-seen" else np.flatnonzero(ytr[ps:pe] > 0.5) + ps
                ids = [itr[rows, k_i] for k_i, _ in scored]
                score_found += client.score_many([k for _, k in scored], ids,
                                                 [np.ones(len(i), np.float32) for i in ids])
                score_sent += sum(len(i) for i in ids)
                score_seconds += time.perf_counter() - t_score
            if tb is not None and time.perf_counter() - mark[0] >= a.progress_secs:
                mark = tb_progress(tb, step + 1, mark, losses, None if a.local_embeddings else emb.stats())
        if not a.local_embeddings:
            emb.wait()  # every push acknowledged: training is done (the flush to RocksDB is not timed)
        seconds = time.perf_counter() - start
        if not a.local_embeddings:
            emb.flush()

        with torch.no_grad():
            logits = []
            for s in range(0, len(yte), 8192):
                ids = ite[s : s + 8192]
                if a.local_embeddings:
                    er = lookup_eval(ids)
                else:
                    er = stack(JaggedFeatures.from_dense(KEYS, ids))
                logits.append(dense(torch.from_numpy(dte[s : s + 8192]), er))
            logits = torch.cat(logits).double()
        stats = emb.stats() if not a.local_embeddings else {}
        capped_rows = _capped_rows(cluster) if caps else 0
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.stop()

    p = torch.sigmoid(logits).clamp(1e-7, 1 - 1e-7).numpy()
    tail = losses[-max(1, len(losses) // 10) :]
    summary = {
        "mode": "local nn.EmbeddingBag" if a.local_embeddings else f"pstrain, {a.servers} servers",
        "torch": torch.__version__,
        "threads": a.threads,
        "batch_size": b,
        "staleness": a.staleness,
        "prefetch": not a.no_prefetch,
        "samples": n,
        "seconds": seconds,
        "samples_per_sec": n / seconds,
        "train_loss": sum(l * k for l, k in tail) / sum(k for _, k in tail),
        "auc": exact_auc(yte, logits.numpy()),
        "logloss": float(-np.mean(yte * np.log(p) + (1 - yte) * np.log(1 - p))),
        "calibration": float(p.mean() / max(yte.mean(), 1e-12)),
        "test_samples": int(len(yte)),
    }
    if a.row_cap_fraction is not None:
        summary.update(row_cap_fraction=a.row_cap_fraction, eviction=a.eviction, capped_tables=len(caps),
                       rows_capped=capped_rows)
        if scored:
            summary.update(score_ms_per_batch=score_seconds / max(steps, 1) * 1e3, scores_sent=score_sent,
                           scores_found=score_found)
    if stats:
        per = lambda k: stats[k] / max(steps, 1) * 1e3
        summary.update(
            pull_ms_per_batch=per("pull_seconds"), push_ms_per_batch=per("push_seconds"),
            wait_ms_per_batch=per("layer_wait_seconds"), replay_ms_per_batch=per("replay_seconds"),
            plan_ms_per_batch=per("plan_seconds"), push_submit_ms_per_batch=per("push_submit_seconds"),
        )
    print(
        f"{summary['mode']}: {n} samples in {seconds:.2f} s = {summary['samples_per_sec']:.0f} samples/s, "
        f"test AUC {summary['auc']:.4f}, logloss {summary['logloss']:.4f}, calibration {summary['calibration']:.3f}"
        + (f"; per batch: pull {summary['pull_ms_per_batch']:.1f} ms, push {summary['push_ms_per_batch']:.1f} ms "
           f"(on I/O threads), waiting {summary['wait_ms_per_batch']:.1f} ms" if stats else "")
    )
    if tb is not None:
        tb.scalars(steps, {"eval/auc": summary["auc"], "eval/logloss": summary["logloss"],
                           "eval/calibration": summary["calibration"],
                           "summary/samples_per_sec": summary["samples_per_sec"]})
        tb.close()
    if a.summary_json:
        with open(a.summary_json, "w") as f:
            json.dump(summary, f, indent=2)
    return summary


if __name__ == "__main__":
    main()
