"""TorchRec's DLRM trained two ways on the same data (issue 42's figure): the 26 tables in process in TorchRec's
``FusedEmbeddingBagCollection`` (row-wise Adagrad fused into backward: TorchRec's fastest CPU path), or on local
pstrain parameter servers through ``pstrain.torchrec.EmbeddingBagCollection`` (row-wise Adagrad on the servers,
staleness K with replay, prefetch of the next batch). Everything else is identical: TorchRec's ``DLRM`` module
(bottom 13-512-256-64-16, dot interaction, top 512-256-1), dense Adam, the initial range of the rows, batches,
evaluation. Prints and writes (``--summary-json``) samples/s, test AUC, for pstrain the per-step cost of the
PS path from ``stats()``, and the CPU the timed loop used: this process's (all its threads: torch's OpenMP workers,
pstrain's I/O threads) and the local servers', in us per sample. On a shared machine the samples/s of one run move
with other tenants' load; the CPU per sample moves much less, and on two saturated cores it is what bounds the
rate (``cpu_cores``: CPU seconds over wall seconds, at most the cores).

    python bench/pytorch/torchrec_dlrm.py --mode torchrec --rows 300000
    python bench/pytorch/torchrec_dlrm.py --mode pstrain --staleness 2 --rows 300000

Ids are the Criteo reader's 64-bit feature ids mapped to 0..vocab-1 per feature (over train and test), since
TorchRec's tables are indexed by row number; both modes see the same indices.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.models.dlrm import DLRM

import pstrain
from pstrain.data import generate, read_criteo
from pstrain.demo import exact_auc

KEYS = [f"C{i + 1}" for i in range(26)]


def kjt_of(idx: np.ndarray) -> KeyedJaggedTensor:
    """One-hot features of a batch (``[b, 26]`` row indices) as a KeyedJaggedTensor."""
    b = idx.shape[0]
    return KeyedJaggedTensor(keys=KEYS, values=torch.from_numpy(np.ascontiguousarray(idx.T).reshape(-1)),
                             lengths=torch.ones(26 * b, dtype=torch.int64))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command's closing parenthesis: state is field 3, utime 14 and stime 15 (1-based, proc(5)).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["torchrec", "pstrain"], required=True)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--test-rows", type=int, default=50_000)
    ap.add_argument("--data-dir", default="data/torchrec-bench")
    ap.add_argument("--batch-size", type=int, default=2048)
    ap.add_argument("--emb-dim", type=int, default=16)
    ap.add_argument("--emb-lr", type=float, default=0.05)
    ap.add_argument("--init-scale", type=float, default=0.05)
    ap.add_argument("--lr", type=float, default=0.002, help="dense Adam")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--staleness", type=int, default=0)
    ap.add_argument("--encoding", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--no-prefetch", action="store_true")
    ap.add_argument("--transport", default="quic", choices=["quic", "tcp"], help="pstrain: client to servers")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--summary-json")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    train_path = generate(a.rows, f"{a.data_dir}/train-{a.rows}.tsv", 1, 7)
    test_path = generate(a.test_rows, f"{a.data_dir}/test-{a.test_rows}.tsv", 2, 7)
    ytr, dtr, itr = read_criteo(train_path)
    yte, dte, ite = read_criteo(test_path)
    both = np.concatenate([itr, ite])
    vocab = [np.unique(both[:, k]) for k in range(26)]
    idx_tr = np.stack([np.searchsorted(vocab[k], itr[:, k]) for k in range(26)], axis=1).astype(np.int64)
    idx_te = np.stack([np.searchsorted(vocab[k], ite[:, k]) for k in range(26)], axis=1).astype(np.int64)

    tables = [EmbeddingBagConfig(name=f"t_{k}", embedding_dim=a.emb_dim, num_embeddings=len(vocab[i]),
                                 feature_names=[k], weight_init_min=-a.init_scale, weight_init_max=a.init_scale)
              for i, k in enumerate(KEYS)]
    cluster = client = None
    if a.mode == "torchrec":
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
        from torchrec.optim import RowWiseAdagrad

        torch.manual_seed(1)
        ebc = FusedEmbeddingBagCollection(tables=tables, optimizer_type=RowWiseAdagrad,
                                          optimizer_kwargs=dict(lr=a.emb_lr, eps=1e-8), device=torch.device("cpu"))
    else:
        from pstrain.torchrec import EmbeddingBagCollection

        cluster = pstrain.LocalCluster(a.servers)
        client = pstrain.Client(cluster.servers, cluster.tls_dir, transport=a.transport)
        ebc = EmbeddingBagCollection(tables, client, optimizer="row_adagrad", lr=a.emb_lr, eps=1e-8,
                                     staleness=a.staleness, encoding=a.encoding)
    torch.manual_seed(0)
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[512, 256, 64, a.emb_dim],
                 over_arch_layer_sizes=[512, 256, 1])
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("sparse_arch")]
    opt = torch.optim.Adam(dense_params, lr=a.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    n, b = len(ytr), a.batch_size
    steps = (n + b - 1) // b
    ytr_t, dtr_t = torch.from_numpy(ytr), torch.from_numpy(dtr)
    try:
        server_pids = list(cluster.pids) if cluster is not None else []
        cpu0 = time.process_time(), [cpu_seconds(p) for p in server_pids]
        start = time.perf_counter()
        nxt = kjt_of(idx_tr[0:b])
        for step in range(steps):
            s, e = step * b, min(n, (step + 1) * b)
            cur = nxt
            logits = model(dtr_t[s:e], cur).squeeze(1)
            if e < n:
                nxt = kjt_of(idx_tr[e : min(n, e + b)])
                if a.mode == "pstrain" and not a.no_prefetch:
                    ebc.prefetch(nxt)
            loss = loss_fn(logits, ytr_t[s:e])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if a.mode == "pstrain":
            ebc.wait()
        seconds = time.perf_counter() - start
        cpu_own = time.process_time() - cpu0[0]
        cpu_servers = sum(cpu_seconds(p) - c for p, c in zip(server_pids, cpu0[1]))
        model.eval()
        with torch.no_grad():
            out = [model(torch.from_numpy(dte[s : s + 8192]), kjt_of(idx_te[s : s + 8192])).squeeze(1)
                   for s in range(0, len(yte), 8192)]
        scores = torch.cat(out).double().numpy()
        stats = ebc.stats() if a.mode == "pstrain" else {}
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.stop()
    summary = dict(mode=a.mode if a.mode == "torchrec" else f"pstrain K={a.staleness}", samples=n, steps=steps,
                   seconds=seconds, samples_per_sec=n / seconds, auc=exact_auc(yte, scores), torch=torch.__version__,
                   threads=a.threads, encoding=a.encoding if a.mode == "pstrain" else "f32 (in process)",
                   cpu_us_per_sample=(cpu_own + cpu_servers) / n * 1e6, cpu_own_us_per_sample=cpu_own / n * 1e6,
                   cpu_servers_us_per_sample=cpu_servers / n * 1e6, cpu_cores=(cpu_own + cpu_servers) / seconds)
    if stats:
        per = lambda k: stats[k] / steps * 1e3
        summary.update(pull_ms=per("pull_seconds"), push_ms=per("push_seconds"), pull_wait_ms=per("pull_wait_seconds"),
                       push_wait_ms=per("push_wait_seconds"), replay_ms=per("replay_seconds"),
                       plan_ms=per("plan_seconds"), push_submit_ms=per("push_submit_seconds"))
    print(json.dumps(summary))
    if a.summary_json:
        with open(a.summary_json, "w") as f:
            json.dump(summary, f, indent=2)
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
