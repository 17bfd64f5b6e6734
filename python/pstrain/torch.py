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

from . import _pstrain
from .client import Client, Table, _check_ids

POOLINGS = ("sum", "mean", "none")
MAX_PREFETCHED = 4


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
    """A group's rows (every table's unique ids, one table after another) as a leaf of the graph; backward
    receives their gradient summed per unique id and pushes it."""

    @staticmethod
    def forward(ctx, anchor, holder, collection, group, uniques):
        ctx.collection, ctx.group, ctx.uniques = collection, group, uniques
        return holder.rows

    @staticmethod
    def backward(ctx, grad):
        ctx.collection._push(ctx.group, ctx.uniques, grad)
        return None, None, None, None, None


class _Plan:
    """A batch's per-table unique ids and, per feature, positions into its group's rows (plus pending pulls)."""

    def __init__(self, collection: "EmbeddingCollection", features: JaggedFeatures):
        self.features = features
        self.unique: Dict[str, np.ndarray] = {}
        # Per feature: positions into its group's concatenated rows.
        self.inverse: Dict[str, np.ndarray] = {}
        for group in collection._groups:
            base = 0
            for name in group:
                t = collection._spec[name]
                parts = [_check_ids(features.key(f)[0], f"feature {f!r} of table {name!r}") for f in t.features]
                allv = np.concatenate(parts) if len(parts) > 1 else parts[0]
                u, inv = _pstrain.unique_inverse(allv)
                self.unique[name] = u
                inv += base
                at = 0
                for f, part in zip(t.features, parts):
                    self.inverse[f] = inv[at : at + len(part)]
                    at += len(part)
                base += len(u)
        self.handles = {}
        # Pulls chained to pushes made after this prefetch (group -> [(tables and masks, handle)]), and the
        # push sequence numbers they cover.
        self.refresh: Dict[tuple, list] = {}
        self.covered = set()
        self.push_seq = 0
        # Per table, (step, ids) of the pushes unacknowledged when the prefetch was sent.
        self.unacked: Dict[str, list] = {}


class EmbeddingCollection(nn.Module):
    """Tables on the parameter servers, looked up by feature.

    ``client``: a connected :class:`pstrain.Client`; ``tables``: :class:`EmbeddingTable` specs, registered on the
    servers here; ``staleness``: steps whose pushes may be unacknowledged when the next step pulls (0 =
    synchronous).

    Tables of one dimension and encoding form a group: each step pulls a group's unique ids in one request per
    server into one buffer, which enters the graph as one tensor; backward pushes the group's gradients in one
    request per server."""

    def __init__(self, client: Client, tables: Sequence[EmbeddingTable], staleness: int = 0):
        super().__init__()
        if staleness < 0:
            raise ValueError(f"staleness = {staleness}: expected >= 0")
        self.client = client
        self.specs = list(tables)
        self.staleness = int(staleness)
        self._tables: Dict[str, Table] = {}
        self._spec: Dict[str, EmbeddingTable] = {}
        self._feature_table: Dict[str, EmbeddingTable] = {}
        for t in self.specs:
            if t.name in self._tables:
                raise ValueError(f"table {t.name!r} given twice")
            self._tables[t.name] = client.register_table(t.name, t.dim, optimizer=t.optimizer, lr=t.lr, **t.options)
            self._spec[t.name] = t
            for f in t.features:
                if f in self._feature_table:
                    raise ValueError(f"feature {f!r} is served by tables {self._feature_table[f].name!r} and {t.name!r}")
                self._feature_table[f] = t
        # A tensor that requires grad, so the pulled rows join the graph (not a Parameter: no optimizer sees it).
        self._anchor = torch.zeros(0, requires_grad=True)
        self._step = 0
        self._inflight = deque()  # (step, [(table, unique ids)], handle) of one push request
        groups = {}
        for t in self.specs:
            tb = self._tables[t.name]
            groups.setdefault((tb.dim, tb.encoding, tb.push_encoding), []).append(t.name)
        self._groups = [tuple(g) for g in groups.values()]
        self._push_seq = 0
        self._push_log = deque()  # (seq, table, unique ids, step) of pushes a prefetch may have missed
        self._prefetched: deque = deque()  # plans of prefetched batches, oldest first (at most MAX_PREFETCHED)
        self.wait_seconds = 0.0

    @property
    def steps(self) -> int:
        """Forward passes so far (the step number of the pushes the last backward sent)."""
        return self._step

    @property
    def features(self) -> List[str]:
        return list(self._feature_table)

    def prefetch(self, features: JaggedFeatures):
        """Starts the pulls of the batch ``features``; a later ``forward`` of the same object uses them. Up to
        ``MAX_PREFETCHED`` batches may be prefetched ahead (the oldest is dropped past that)."""
        plan = _Plan(self, features)
        plan.push_seq = self._push_seq
        # Pushes not yet acknowledged may be applied after the prefetch reads: their ids are pulled again.
        for step, parts, h in self._inflight:
            if not h.done():
                for table, ids in parts:
                    plan.unacked.setdefault(table, []).append((step, ids))
        self._start_pulls(plan)
        self._prefetched.append(plan)
        while len(self._prefetched) > MAX_PREFETCHED:
            self._prefetched.popleft()

    def forward(self, features: JaggedFeatures, stack: bool = False):
        """Per feature, the pooled rows ``[batch, dim]`` (or, with pooling ``none``, the rows of the feature's
        values). ``stack=True`` returns one ``[batch, features, dim]`` tensor instead, features in
        :attr:`features` order (every feature pooled, one dimension)."""
        self._wait_pushes(self.staleness)
        plan = None
        for i, p in enumerate(self._prefetched):
            if p.features is features:
                plan = p
                del self._prefetched[i]
                break
        if plan is None:
            plan = _Plan(self, features)
            self._start_pulls(plan)
            stale = {}
        else:
            # Rows the prefetch may have read before pushes this step must see were applied: pushes of the steps
            # outside the staleness window (every earlier one at staleness 0) that were unacknowledged when the
            # prefetch was sent, or sent after it.
            must_see = self._step - self.staleness
            stale = {}
            for table, entries in plan.unacked.items():
                stale[table] = [ids for step, ids in entries if step <= must_see]
            for seq, table, ids, step in self._push_log:
                if seq >= plan.push_seq and step <= must_see and seq not in plan.covered:
                    stale.setdefault(table, []).append(ids)
        self._trim_log()
        self._step += 1
        out = {}
        gathered = []  # (features, their concatenated rows) of one-hot or unpooled features, per group
        for group in self._groups:
            start = time.perf_counter()
            rows = plan.handles[group].wait(concat=True)
            for parts, pulled in plan.refresh.get(group, ()):
                # Rows a push of the last step changed, pulled right after its acknowledgement, in push order.
                for (name, at, mask), r in zip(parts, pulled.wait()):
                    rows[at : at + len(plan.unique[name])][mask] = r
            base, again = 0, []
            for name in group:
                unique = plan.unique[name]
                if stale.get(name):
                    mask = np.isin(unique, np.concatenate(stale[name]))
                    if mask.any():
                        again.append((name, base, mask))
                base += len(unique)
            if again:
                # One pull (one request per server) for every table of the group with rows to read again.
                fresh = self.client.pull_many([self._tables[n] for n, _, _ in again],
                                              [plan.unique[n][m] for n, _, m in again]).wait()
                for (name, at, mask), r in zip(again, fresh):
                    rows[at : at + len(plan.unique[name])][mask] = r
            self.wait_seconds += time.perf_counter() - start
            weight = torch.from_numpy(rows)
            if torch.is_grad_enabled():
                weight = _PulledRows.apply(self._anchor, _Holder(weight), self, group,
                                           [plan.unique[n] for n in group])
            direct, bags = [], []
            for name in group:
                t = self._spec[name]
                for f in t.features:
                    _, lengths = features.key(f)
                    one_hot = len(plan.inverse[f]) == len(lengths) and (lengths == 1).all()
                    (direct if t.pooling == "none" or one_hot else bags).append(f)
            if direct:
                inv = np.concatenate([plan.inverse[f] for f in direct]) if len(direct) > 1 else plan.inverse[direct[0]]
                picked = weight.index_select(0, torch.from_numpy(inv))
                gathered.append((direct, picked))
                out.update(zip(direct, torch.split(picked, [len(plan.inverse[f]) for f in direct])))
            for f in bags:
                _, lengths = features.key(f)
                offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
                out[f] = F.embedding_bag(torch.from_numpy(plan.inverse[f]), weight, offsets,
                                         mode=self._feature_table[f].pooling)
        if not stack:
            return out
        keys = self.features
        if len(gathered) == 1 and gathered[0][0] == keys and all(self._feature_table[k].pooling != "none" for k in keys):
            # Every feature one-hot in one group: the gathered rows are [features x batch] already.
            return gathered[0][1].view(len(keys), features.batch_size, -1).transpose(0, 1)
        return torch.stack([out[k] for k in keys], dim=1)

    def _start_pulls(self, plan: _Plan):
        """One pull per group of tables (one request per server for all of a group's tables)."""
        for group in self._groups:
            plan.handles[group] = self.client.pull_many([self._tables[n] for n in group],
                                                        [plan.unique[n] for n in group])

    def _push(self, group, uniques, grad: torch.Tensor):
        """Backward of a group's rows: one push request per server for all of its tables. At staleness 0 with
        the next batch prefetched, the push carries the pull of the prefetched rows it changes, sent as soon as
        the push is acknowledged (no round trip through Python)."""
        g = grad.detach().to(torch.float32).contiguous().numpy()
        grads, at = [], 0
        for u in uniques:
            grads.append(g[at : at + len(u)])
            at += len(u)
        tables = [self._tables[n] for n in group]
        nxt = self._prefetched[-1] if self.staleness == 0 and len(self._prefetched) == 1 else None
        again = []
        if nxt is not None:
            base = 0
            for name, u in zip(group, uniques):
                mask = np.isin(nxt.unique[name], u)
                if mask.any():
                    again.append((name, base, mask))
                base += len(nxt.unique[name])
        if again:
            t0 = tables[0]
            h, pulled = self.client._c.push_then_pull_async(
                [(t.id, t.dim) for t in tables], f"{len(tables)} tables", t0.push_encoding,
                list(uniques), grads, [(self._tables[n].id, t0.dim) for n, _, _ in again], t0.encoding,
                [nxt.unique[n][m] for n, _, m in again])
            nxt.refresh.setdefault(group, []).append((again, pulled))
            nxt.covered.add(self._push_seq)
        else:
            h = self.client.push_many(tables, list(uniques), grads)
        for name, unique in zip(group, uniques):
            self._push_log.append((self._push_seq, name, unique, self._step))
        self._inflight.append((self._step, list(zip(group, uniques)), h))
        self._push_seq += 1

    def _wait_pushes(self, keep_steps: int):
        """Waits until only pushes of the last ``keep_steps`` steps are unacknowledged (raising their errors)."""
        start = time.perf_counter()
        while self._inflight and self._inflight[0][0] <= self._step - keep_steps:
            self._inflight.popleft()[2].wait()
        self.wait_seconds += time.perf_counter() - start

    def _trim_log(self):
        keep_from = min((p.push_seq for p in self._prefetched), default=self._push_seq)
        while self._push_log and self._push_log[0][0] < keep_from:
            self._push_log.popleft()

    def wait(self):
        """Waits until every push so far is acknowledged (raising the first error)."""
        self._wait_pushes(0)

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
