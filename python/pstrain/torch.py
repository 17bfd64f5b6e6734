"""PyTorch layer: embedding tables on the parameter servers as an ``nn.Module``.

``EmbeddingCollection`` takes a :class:`JaggedFeatures` batch (keys, values, lengths: the layout TorchRec users
know from ``KeyedJaggedTensor``, without a TorchRec dependency) and returns, per feature, the pooled rows
(``sum`` or ``mean``: ``[batch, dim]``) or the unpooled rows (``none``: ``[len(values of the key), dim]``).

Per table and step, the ids of every feature of the table are deduplicated and pulled once; the rows enter the
autograd graph through a ``torch.autograd.Function`` whose backward receives the gradient already summed per
unique id (``embedding_bag``'s weight gradient) and pushes it asynchronously. ``staleness`` bounds the steps
whose pushes may still be in flight when the next step pulls (0 = synchronous: every push is acknowledged
before the next pull, as with local tables). The servers run the tables' optimizers; the dense part of a model
is any torch module with any torch optimizer.

``prefetch(next_batch)`` starts the next batch's pulls so they overlap this batch's compute; rows of ids that
this batch then pushes are pulled again before use, so prefetching changes no result at staleness 0.
"""

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .client import Client, Table, _check_ids

POOLINGS = ("sum", "mean", "none")


class JaggedFeatures:
    """A batch of sparse features: for each key, each sample's list of ids.

    ``values``: every id, key-major then sample-major (all of key 0's samples, then key 1's, ...);
    ``lengths``: ``len(keys) * batch_size`` counts in the same order. Ids are int64 (>= 0) or uint64."""

    def __init__(self, keys: Sequence[str], values, lengths):
        self.keys = list(keys)
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"JaggedFeatures: duplicate keys in {self.keys}")
        self.values = _to_numpy(values, "values")
        self.lengths = _to_numpy(lengths, "lengths").astype(np.int64, copy=False)
        if self.values.ndim != 1 or self.lengths.ndim != 1:
            raise ValueError(
                f"JaggedFeatures: values and lengths must be 1-D, got {self.values.shape} and {self.lengths.shape}"
            )
        if not self.keys:
            raise ValueError("JaggedFeatures: no keys")
        if len(self.lengths) % len(self.keys):
            raise ValueError(f"JaggedFeatures: {len(self.lengths)} lengths are not a multiple of {len(self.keys)} keys")
        if (self.lengths < 0).any():
            raise ValueError("JaggedFeatures: negative length")
        if int(self.lengths.sum()) != len(self.values):
            raise ValueError(f"JaggedFeatures: lengths sum to {int(self.lengths.sum())}, but there are {len(self.values)} values")
        self.batch_size = len(self.lengths) // len(self.keys)
        per_key = self.lengths.reshape(len(self.keys), self.batch_size).sum(axis=1)
        self._bounds = np.concatenate([[0], np.cumsum(per_key)])
        self._index = {k: i for i, k in enumerate(self.keys)}

    @classmethod
    def from_dense(cls, keys: Sequence[str], ids) -> "JaggedFeatures":
        """One id per sample and key: ``ids`` is ``[batch, len(keys)]``."""
        ids = _to_numpy(ids, "ids")
        if ids.ndim != 2 or ids.shape[1] != len(keys):
            raise ValueError(f"JaggedFeatures.from_dense: ids shape {ids.shape}, expected (batch, {len(keys)})")
        return cls(keys, np.ascontiguousarray(ids.T).reshape(-1), np.ones(ids.size, dtype=np.int64))

    @classmethod
    def from_lists(cls, features: Dict[str, List[List[int]]]) -> "JaggedFeatures":
        """From ``{key: [ids of sample 0, ids of sample 1, ...]}`` (every key with the same number of samples)."""
        keys = list(features)
        sizes = {len(v) for v in features.values()}
        if len(sizes) != 1:
            raise ValueError(f"JaggedFeatures.from_lists: keys have different batch sizes {sorted(sizes)}")
        values = [i for k in keys for sample in features[k] for i in sample]
        lengths = [len(sample) for k in keys for sample in features[k]]
        return cls(keys, np.asarray(values, dtype=np.int64), np.asarray(lengths, dtype=np.int64))

    def key(self, key: str):
        """``(values, lengths)`` of one key."""
        if key not in self._index:
            raise KeyError(f"JaggedFeatures has no key {key!r}: keys are {self.keys}")
        i = self._index[key]
        b = self.batch_size
        return self.values[self._bounds[i] : self._bounds[i + 1]], self.lengths[i * b : (i + 1) * b]


def _to_numpy(x, what: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{what}: tensor dtype {x.dtype}: expected torch.int64")
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"{what}: expected a numpy array or a torch tensor, got {type(x).__name__}")


@dataclass
class EmbeddingTable:
    """One table of an :class:`EmbeddingCollection`: ``features`` are the keys it serves (default: its name);
    ``pooling`` is ``sum``, ``mean`` or ``none``; the remaining settings go to :meth:`Client.register_table`
    (optimizer and learning rate, initializer, encodings)."""

    name: str
    dim: int
    features: List[str] = field(default_factory=list)
    pooling: str = "sum"
    optimizer: str = "sgd"
    lr: float = 0.01
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.features:
            self.features = [self.name]
        if self.pooling not in POOLINGS:
            raise ValueError(f"table {self.name!r}: pooling = {self.pooling!r}, expected one of {POOLINGS}")


class _Holder:
    """Carries the pulled rows into the autograd function without making them an input."""

    __slots__ = ("rows",)

    def __init__(self, rows):
        self.rows = rows


class _PulledRows(torch.autograd.Function):
    """Rows of a table's unique ids as a leaf of the graph; backward pushes their gradient."""

    @staticmethod
    def forward(ctx, anchor, holder, collection, table, unique):
        ctx.collection, ctx.table, ctx.unique = collection, table, unique
        return holder.rows

    @staticmethod
    def backward(ctx, grad):
        ctx.collection._push(ctx.table, ctx.unique, grad)
        return None, None, None, None, None


class _Plan:
    """A batch's per-table unique ids and, per feature, positions into them (plus pending pulls)."""

    def __init__(self, collection: "EmbeddingCollection", features: JaggedFeatures):
        self.features = features
        self.unique: Dict[str, np.ndarray] = {}
        self.inverse: Dict[str, Dict[str, np.ndarray]] = {}
        for t in collection.specs:
            parts = []
            for f in t.features:
                values, _ = features.key(f)
                parts.append(_check_ids(values, f"feature {f!r} of table {t.name!r}"))
            allv = np.concatenate(parts) if len(parts) > 1 else parts[0]
            u, inv = np.unique(allv, return_inverse=True)
            self.unique[t.name] = u
            bounds = np.cumsum([0] + [len(p) for p in parts])
            self.inverse[t.name] = {f: inv[bounds[i] : bounds[i + 1]] for i, f in enumerate(t.features)}
        self.handles = {}
        self.push_seq = 0
        self.unacked: Dict[str, List[np.ndarray]] = {}


class EmbeddingCollection(nn.Module):
    """Tables on the parameter servers, looked up by feature.

    ``client``: a connected :class:`pstrain.Client`; ``tables``: :class:`EmbeddingTable` specs, registered on the
    servers here; ``staleness``: steps whose pushes may be unacknowledged when the next step pulls (0 =
    synchronous)."""

    def __init__(self, client: Client, tables: Sequence[EmbeddingTable], staleness: int = 0):
        super().__init__()
        if staleness < 0:
            raise ValueError(f"staleness = {staleness}: expected >= 0")
        self.client = client
        self.specs = list(tables)
        self.staleness = int(staleness)
        self._tables: Dict[str, Table] = {}
        self._feature_table: Dict[str, EmbeddingTable] = {}
        for t in self.specs:
            if t.name in self._tables:
                raise ValueError(f"table {t.name!r} given twice")
            self._tables[t.name] = client.register_table(t.name, t.dim, optimizer=t.optimizer, lr=t.lr, **t.options)
            for f in t.features:
                if f in self._feature_table:
                    raise ValueError(f"feature {f!r} is served by tables {self._feature_table[f].name!r} and {t.name!r}")
                self._feature_table[f] = t
        # A tensor that requires grad, so the pulled rows join the graph (not a Parameter: no optimizer sees it).
        self._anchor = torch.zeros(0, requires_grad=True)
        self._step = 0
        self._inflight = deque()  # (step, [(table, unique ids)], handle) of one push request
        self._pending = {}  # table -> (unique ids, gradient) of the step being back-propagated
        groups = {}
        for t in self.specs:
            groups.setdefault(self._tables[t.name].encoding, []).append(t.name)
        self._groups = [tuple(g) for g in groups.values()]
        self._push_seq = 0
        self._push_log = deque()  # (seq, table, unique ids) of pushes a prefetch may have missed
        self._prefetched: Optional[_Plan] = None
        self.wait_seconds = 0.0
        self.steps = 0

    @property
    def features(self) -> List[str]:
        return list(self._feature_table)

    def prefetch(self, features: JaggedFeatures):
        """Starts the pulls of the batch ``features`` (the next ``forward`` of the same object uses them)."""
        plan = _Plan(self, features)
        plan.push_seq = self._push_seq
        # Pushes not yet acknowledged may be applied after the prefetch reads: their ids are pulled again.
        for _, parts, h in self._inflight:
            if not h.done():
                for table, ids in parts:
                    plan.unacked.setdefault(table, []).append(ids)
        self._start_pulls(plan)
        self._prefetched = plan

    def forward(self, features: JaggedFeatures) -> Dict[str, torch.Tensor]:
        self._wait_pushes(self.staleness)
        plan = self._prefetched
        self._prefetched = None
        if plan is None or plan.features is not features:
            plan = _Plan(self, features)
            self._start_pulls(plan)
            stale = {}
        else:
            stale = plan.unacked
            for seq, table, ids in self._push_log:
                if seq >= plan.push_seq:
                    stale.setdefault(table, []).append(ids)
        self._trim_log()
        out = {}
        self._step += 1
        start = time.perf_counter()
        pulled = {}
        for names, h in plan.handles.items():
            pulled.update(zip(names, h.wait()))
        self.wait_seconds += time.perf_counter() - start
        for t in self.specs:
            start = time.perf_counter()
            rows = pulled[t.name]
            unique = plan.unique[t.name]
            if t.name in stale:
                mask = np.isin(unique, np.concatenate(stale[t.name]))
                if mask.any():
                    rows[mask] = self.client.pull(self._tables[t.name], unique[mask])
            self.wait_seconds += time.perf_counter() - start
            weight = torch.from_numpy(rows)
            if torch.is_grad_enabled():
                weight = _PulledRows.apply(self._anchor, _Holder(weight), self, t.name, unique)
            for f in t.features:
                inv = torch.from_numpy(plan.inverse[t.name][f].astype(np.int64, copy=False))
                _, lengths = features.key(f)
                if t.pooling == "none" or (t.pooling in ("sum", "mean") and len(inv) == len(lengths) and (lengths == 1).all()):
                    out[f] = weight.index_select(0, inv)
                else:
                    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
                    out[f] = F.embedding_bag(inv, weight, offsets, mode=t.pooling)
        self.steps += 1
        return out

    def _start_pulls(self, plan: _Plan):
        """One pull per encoding group of tables (one request per server for all of a group's tables)."""
        for names in self._groups:
            plan.handles[names] = self.client.pull_many([self._tables[n] for n in names],
                                                        [plan.unique[n] for n in names])

    def _push(self, table: str, unique: np.ndarray, grad: torch.Tensor):
        """Backward of one table's rows: kept until every table of the step has its gradient, then pushed in
        one request per server (per push encoding)."""
        g = grad.detach().to(torch.float32).contiguous().numpy()
        self._pending[table] = (unique, g)
        if len(self._pending) == len(self.specs):
            self._send_pending()

    def _send_pending(self):
        if not self._pending:
            return
        groups = {}
        for table, (unique, g) in self._pending.items():
            groups.setdefault(self._tables[table].push_encoding, []).append((table, unique, g))
        self._pending = {}
        for parts in groups.values():
            names = [p[0] for p in parts]
            h = self.client.push_many([self._tables[n] for n in names], [p[1] for p in parts], [p[2] for p in parts])
            for table, unique, _ in parts:
                self._push_log.append((self._push_seq, table, unique))
            self._inflight.append((self._step, [(p[0], p[1]) for p in parts], h))
            self._push_seq += 1

    def _wait_pushes(self, keep_steps: int):
        """Waits until only pushes of the last ``keep_steps`` steps are unacknowledged (raising their errors)."""
        self._send_pending()
        start = time.perf_counter()
        while self._inflight and self._inflight[0][0] <= self._step - keep_steps:
            self._inflight.popleft()[2].wait()
        self.wait_seconds += time.perf_counter() - start

    def _trim_log(self):
        keep_from = self._prefetched.push_seq if self._prefetched is not None else self._push_seq
        while self._push_log and self._push_log[0][0] < keep_from:
            self._push_log.popleft()

    def flush(self) -> int:
        """Waits for every push, then has the servers write their dirty rows to RocksDB."""
        self._wait_pushes(0)
        return self.client.flush()

    def checkpoint(self, directory: str, step: Optional[int] = None):
        """Waits for every push, then snapshots every server's tables under ``directory``."""
        self._wait_pushes(0)
        return self.client.checkpoint(directory, self.steps if step is None else step)

    def stats(self) -> dict:
        """The client's counters plus this layer's steps and seconds spent waiting for pulls and pushes."""
        s = dict(self.client.stats())
        s.update(steps=self.steps, layer_wait_seconds=self.wait_seconds)
        return s
