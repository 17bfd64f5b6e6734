"""The lookup engine under ``pstrain.torch`` and ``pstrain.torchrec``: a batch's ids in, rows in the autograd
graph out, gradients back to the servers. The two front ends only translate their input and output types.

A step, per group of tables (tables of one dimension and encodings share one request per server):

1. **plan**: per table, the distinct ids of every feature it serves (``unique_inverse``, in Rust), and per
   feature the positions of its ids among the group's rows;
2. **pull**: one request per server for the group's distinct ids, on the collection's *lane*
   (``pstrain._pstrain.Lane``): it runs after every push entered before it was answered, and every push
   entered after it waits for its answer. So a pulled row holds exactly this collection's updates entered
   before the pull, and none entered after;
3. **replay**: updates entered after the pull (a prefetched batch pulled before the previous step's push) are
   applied to the pulled rows with the table's optimizer and the optimizer state pulled alongside, as the
   servers will apply them (``Client.replay``, the Rust trainer's ``--replay-own-updates``). A step therefore
   computes with the rows a synchronous run would, whatever the staleness (bit for bit with f32 rows on the
   wire and one trainer; other trainers' updates arrive as they are applied);
4. **compute**: the rows enter the graph as one leaf per group; features gather (one-hot, unpooled) or pool
   (``embedding_bag``, with per-id weights) from it;
5. **push**: backward gives the gradient summed per distinct id. With ``fused=True`` (TorchRec's fused
   optimizer semantics) it is pushed at once, divided by the ``GradScaler``'s scale if one is given (a step
   whose gradients are not finite is skipped and counted); with ``fused=False`` it accumulates on the
   optimizer handle's parameters (``.grad``), where ``GradScaler.unscale_``, gradient clipping and
   accumulation over several backwards act as on any tensor, and ``optimizer.step()`` pushes it.

``staleness`` K bounds the updates whose pushes may be unacknowledged when a step computes (0: every earlier
push acknowledged: the servers hold every step before this one, and a crash loses at most the step running).
Replay makes the rows the same for every K; a larger K only lets pushes overlap more compute.

Per-table learning rates live in the optimizer handle's ``param_groups`` (one group per table), so learning
rate schedulers apply. Every push carries the multiplier of the table's registered learning rate its group's
``lr`` asks for (``lr_scale``), and the servers (and the replay of pushes in flight) run the table's optimizer
at that rate, whatever the optimizer: sgd, row-wise Adagrad and Adam alike.
"""

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from . import _pstrain
from .client import Client, Table, _check_ids

POOLINGS = ("sum", "mean", "none")
MAX_PREFETCHED = 4
# Rows per request when a whole table is read or written (state_dict, load_state_dict).
PAGE_ROWS = 65536


@dataclass
class TableSpec:
    """One table as the engine sees it: name on the servers, dimension, the features it serves, pooling, the
    server-side optimizer and its learning rate, further ``Client.register_table`` options, and (optional) the
    row count ``num_embeddings`` (ids must then be below it, and ``state_dict`` holds every row)."""

    name: str
    dim: int
    features: List[str]
    pooling: str = "sum"
    optimizer: str = "sgd"
    lr: float = 0.01
    options: dict = field(default_factory=dict)
    num_embeddings: Optional[int] = None


class Batch:
    """A batch's sparse features as numpy arrays, per key: ids (uint64), lengths (int64, one per sample) and
    optional per-id weights (float32). ``source`` is the object it was made from (prefetch matches on it);
    ``device`` is where outputs go."""

    __slots__ = ("keys", "batch_size", "ids", "lengths", "weights", "source", "device")

    def __init__(self, keys, batch_size, ids, lengths, weights, source=None, device=None):
        self.keys: List[str] = keys
        self.batch_size: int = batch_size
        self.ids: Dict[str, np.ndarray] = ids
        self.lengths: Dict[str, np.ndarray] = lengths
        self.weights: Dict[str, Optional[np.ndarray]] = weights
        self.source = source
        self.device = device


class _Holder:
    """Carries the pulled rows into the autograd function without making them an input."""

    __slots__ = ("rows",)

    def __init__(self, rows):
        self.rows = rows


class _PulledRows(torch.autograd.Function):
    """A group's rows (every table's distinct ids, one table after another) as a leaf of the graph; backward
    receives their gradient summed per distinct id."""

    @staticmethod
    def forward(ctx, anchor, holder, engine, group, uniques):
        ctx.engine, ctx.group, ctx.uniques = engine, group, uniques
        return holder.rows

    @staticmethod
    def backward(ctx, grad):
        ctx.engine._backward(ctx.group, ctx.uniques, grad)
        return None, None, None, None, None


class _Plan:
    """A batch's per-table distinct ids and, per feature, positions into its group's rows; the pulls of its
    groups and their sequence numbers on the lane."""

    def __init__(self, engine: "Lookup", batch: Batch):
        self.batch = batch
        self.unique: Dict[str, np.ndarray] = {}
        self.inverse: Dict[str, np.ndarray] = {}
        for group in engine.groups:
            features = [engine.specs[name].features for name in group]
            # One call per group (in Rust): every table's distinct ids, every feature's positions.
            uniques, inv = _pstrain.plan_group([[batch.ids[f] for f in fs] for fs in features])
            at = 0
            for name, u, fs in zip(group, uniques, features):
                self.unique[name] = u
                for f in fs:
                    n = len(batch.ids[f])
                    self.inverse[f] = inv[at : at + n]
                    at += n
        self.handles = {}
        self.with_state = False


class Lookup:
    """The engine (see the module docs): ``client``, ``specs`` (registered here), ``staleness`` K, ``fused``,
    ``grad_scaler``."""

    def __init__(self, client: Client, specs: Sequence[TableSpec], staleness: int = 0, fused: bool = True,
                 grad_scaler=None):
        if not isinstance(staleness, int) or isinstance(staleness, bool) or staleness < 0:
            raise ValueError(f"staleness = {staleness!r}: expected an integer >= 0")
        if grad_scaler is not None and not fused:
            raise ValueError("grad_scaler: with fused=False pass the optimizer to the scaler instead "
                             "(scaler.step(collection.fused_optimizer)), which unscales its gradients")
        self.client = client
        self.staleness = staleness
        self.fused = fused
        self.grad_scaler = grad_scaler
        self.specs: Dict[str, TableSpec] = {}
        self.tables: Dict[str, Table] = {}
        self.feature_table: Dict[str, str] = {}
        for s in specs:
            if s.name in self.specs:
                raise ValueError(f"table {s.name!r} given twice")
            if s.pooling not in POOLINGS:
                raise ValueError(f"table {s.name!r}: pooling = {s.pooling!r}, expected one of {POOLINGS}")
            if not s.features:
                raise ValueError(f"table {s.name!r}: no features")
            for f in s.features:
                if f in self.feature_table:
                    raise ValueError(f"feature {f!r} is served by tables {self.feature_table[f]!r} and {s.name!r}")
                self.feature_table[f] = s.name
            self.tables[s.name] = client.register_table(s.name, s.dim, optimizer=s.optimizer, lr=s.lr, **s.options)
            self.specs[s.name] = s
        groups: Dict[tuple, List[str]] = {}
        for s in specs:
            t = self.tables[s.name]
            groups.setdefault((t.dim, t.encoding, t.push_encoding), []).append(s.name)
        self.groups: List[Tuple[str, ...]] = [tuple(g) for g in groups.values()]
        # Per group: its tables, their (id, dim) for the extension, and how errors name them.
        self._group_tables = {g: [self.tables[n] for n in g] for g in self.groups}
        self._group_keys = {g: [(t.id, t.dim) for t in ts] for g, ts in self._group_tables.items()}
        self._group_what = {g: "tables " + ", ".join(repr(n) for n in g) if len(g) < 5 else f"{len(g)} tables"
                            for g in self.groups}
        self.lane = _pstrain.Lane()
        # A tensor that requires grad, so the pulled rows join the graph (not a Parameter: no optimizer sees it).
        self._anchor = torch.zeros(0, requires_grad=True)
        self._prefetched: deque = deque()  # plans of prefetched batches, oldest first (at most MAX_PREFETCHED)
        # The pushes a prefetched pull may lack (their ids and gradients as pushed), kept by the extension.
        self._log = _pstrain.ReplayLog()
        self._inflight: deque = deque()  # (update index, [push handles])
        self.updates = 0  # updates submitted (pushes of one step)
        self.steps = 0  # forward passes
        self.skipped_updates = 0  # fused steps skipped for non-finite gradients (GradScaler)
        self.timing = dict(plan=0.0, pull_wait=0.0, replay=0.0, push=0.0, push_wait=0.0)
        # With fused=False: per table the distinct ids and summed gradients since the last step().
        self._acc: Dict[str, Tuple[np.ndarray, torch.Tensor]] = {}
        self.params: Dict[str, torch.Tensor] = {
            n: torch.empty(0, s.dim, requires_grad=True) for n, s in self.specs.items()}
        self.optimizer = EmbeddingOptimizer(self)

    # ---- forward ----

    def check_ids(self, batch: Batch):
        """Refuses ids past a table's ``num_embeddings``, naming the feature, position and value."""
        for f in self.feature_table:
            n = self.specs[self.feature_table[f]].num_embeddings
            ids = batch.ids.get(f)
            if n is None or ids is None or not len(ids):
                continue
            bad = ids >= np.uint64(n)
            if bad.any():
                i = int(np.argmax(bad))
                v = int(ids[i])
                shown = v - (1 << 64) if v >= 1 << 63 else v
                raise ValueError(f"feature {f!r}: id {shown} at position {i} of its values is out of range for "
                                 f"table {self.feature_table[f]!r} of num_embeddings {n}")

    def prefetch(self, batch: Batch):
        """Starts the pulls of ``batch`` (with optimizer state, for replay); the forward of the same batch uses
        them. Up to ``MAX_PREFETCHED`` batches ahead (the oldest is dropped past that)."""
        start = time.perf_counter()
        plan = _Plan(self, batch)
        self.timing["plan"] += time.perf_counter() - start
        self._start_pulls(plan, with_state=True)
        self._prefetched.append(plan)
        while len(self._prefetched) > MAX_PREFETCHED:
            self._prefetched.popleft()

    def _start_pulls(self, plan: _Plan, with_state: bool):
        plan.with_state = with_state
        for group in self.groups:
            # The ids are the plan's (uint64, distinct): straight to the extension, without the public API's checks.
            plan.handles[group] = self.client._c.pull_async(
                self._group_keys[group], self._group_what[group], self._group_tables[group][0].encoding,
                [plan.unique[n] for n in group], self.lane, with_state)

    def _check_lrs(self):
        for g in self.optimizer.param_groups:
            s = self.specs[g["table"]]
            lr = g["lr"]
            if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
                raise ValueError(f"table {s.name!r}: learning rate {lr!r} set in the optimizer handle, expected a "
                                 "finite number >= 0")

    def _lr_scale(self, name: str, lrs: Dict[str, float]) -> float:
        """The multiplier of table ``name``'s registered learning rate that its param group's ``lr`` asks for."""
        s = self.specs[name]
        return 1.0 if lrs[name] == s.lr else float(lrs[name]) / float(s.lr)

    def lookup(self, batch: Batch, stack: Optional[List[str]] = None, concat: Optional[List[str]] = None):
        """Per feature of ``batch`` served here: pooled rows ``[batch, dim]``, or for pooling ``none`` the rows
        of its ids ``[len(ids), dim]``; in the graph when grad is enabled. With ``stack`` (feature names, all
        pooled, one dimension): one ``[batch, len(stack), dim]`` tensor in that order instead; with ``concat``
        (feature names, all pooled): one ``[batch, sum of dims]`` tensor, the features side by side in that
        order (TorchRec's ``KeyedTensor`` values)."""
        self._check_lrs()
        self.wait_pushes(self.staleness)
        plan = None
        for i, p in enumerate(self._prefetched):
            if p.batch is batch or (batch.source is not None and p.batch.source is batch.source):
                plan = p
                del self._prefetched[i]
                break
        if plan is None:
            start = time.perf_counter()
            plan = _Plan(self, batch)
            self.timing["plan"] += time.perf_counter() - start
            self._start_pulls(plan, with_state=False)
        self.steps += 1
        out: Dict[str, torch.Tensor] = {}
        grad = torch.is_grad_enabled()
        layout = stack if stack is not None else concat
        # Every feature of the layout one-hot, in the one group: one index_select gives the rows sample by sample,
        # already in the layout's shape (no split, stack or cat after it).
        side_by_side = (layout is not None and len(self.groups) == 1 and sorted(layout) == sorted(self.feature_table)
                        and all(self._one_hot(plan, f) for f in layout))
        for group in self.groups:
            start = time.perf_counter()
            h = plan.handles[group]
            rows = h.wait(None, True, self._log if plan.with_state else None)[0]
            replayed = h.replay_seconds
            self.timing["pull_wait"] += time.perf_counter() - start - replayed
            self.timing["replay"] += replayed
            weight = torch.from_numpy(rows)
            if grad:
                weight = _PulledRows.apply(self._anchor, _Holder(weight), self, group,
                                           [plan.unique[n] for n in group])
            if side_by_side:
                inv = np.stack([plan.inverse[f] for f in layout], axis=1).reshape(-1)
                picked = weight.index_select(0, torch.from_numpy(inv))
                res = picked.view(batch.batch_size, len(layout), -1) if stack is not None else \
                    picked.view(batch.batch_size, -1)
            else:
                self._gather(group, plan, weight, out)
        self._trim_log()
        if layout is not None:
            if not side_by_side:
                res = torch.stack([out[k] for k in stack], dim=1) if stack is not None else \
                    torch.cat([out[k] for k in concat], dim=1)
            return res.to(batch.device) if batch.device is not None and batch.device.type != "cpu" else res
        if batch.device is not None and batch.device.type != "cpu":
            out = {k: v.to(batch.device) for k, v in out.items()}
        return out

    @staticmethod
    def _one_hot(plan: _Plan, f: str) -> bool:
        """Whether feature ``f`` of the plan's batch has one unweighted id per sample."""
        lengths = plan.batch.lengths[f]
        return (len(plan.inverse[f]) == len(lengths) and plan.batch.weights.get(f) is None
                and bool((lengths == 1).all()))

    def _gather(self, group, plan: _Plan, weight: torch.Tensor, out: Dict[str, torch.Tensor]):
        batch = plan.batch
        direct, bags = [], []
        for name in group:
            spec = self.specs[name]
            for f in spec.features:
                (direct if spec.pooling == "none" or self._one_hot(plan, f) else bags).append(f)
        if direct:
            inv = np.concatenate([plan.inverse[f] for f in direct]) if len(direct) > 1 else plan.inverse[direct[0]]
            picked = weight.index_select(0, torch.from_numpy(inv))
            out.update(zip(direct, torch.split(picked, [len(plan.inverse[f]) for f in direct])))
        for f in bags:
            lengths = batch.lengths[f]
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
            pooling = self.specs[self.feature_table[f]].pooling
            w = batch.weights.get(f)
            if w is None:
                out[f] = F.embedding_bag(torch.from_numpy(plan.inverse[f]), weight, offsets, mode=pooling)
            else:
                # embedding_bag takes per-id weights with sum pooling only; weighted mean is the weighted sum
                # over the bag's length (FBGEMM's and TorchRec's definition).
                pooled = F.embedding_bag(torch.from_numpy(plan.inverse[f]), weight, offsets, mode="sum",
                                         per_sample_weights=torch.from_numpy(w))
                if pooling == "mean":
                    pooled = pooled / torch.from_numpy(np.maximum(lengths, 1).astype(np.float32)).unsqueeze(1)
                out[f] = pooled

    def _trim_log(self):
        oldest = min((h.seq for p in self._prefetched for h in p.handles.values()), default=None)
        self._log.trim(oldest)

    # ---- backward and push ----

    def _backward(self, group, uniques, grad: torch.Tensor):
        g = grad.detach().to(torch.float32)
        if self.fused:
            divisor = 1.0
            if self.grad_scaler is not None and self.grad_scaler.is_enabled():
                divisor = float(self.grad_scaler.get_scale())
            # Divided by the scale, checked finite and copied in one pass (in Rust).
            bad = self._push(list(group), list(uniques), g.contiguous().numpy(), divisor)
            if bad is not None:
                if self.grad_scaler is not None:
                    # GradScaler's contract: a step with inf/NaN gradients is skipped (the scale then drops).
                    self.skipped_updates += 1
                    return
                r, c, v = bad
                name, at = self._row_table(group, uniques, r)
                raise ValueError(f"table {name!r}: gradient of id {int(uniques[group.index(name)][at])} column {c} is "
                                 f"{v}: gradients must be finite (with AMP, pass grad_scaler=)")
        else:
            at = 0
            for name, u in zip(group, uniques):
                self._accumulate(name, u, g[at : at + len(u)])
                at += len(u)

    @staticmethod
    def _row_table(group, uniques, r):
        at = 0
        for name, u in zip(group, uniques):
            if r < at + len(u):
                return name, r - at
            at += len(u)
        return group[-1], 0

    def _accumulate(self, name: str, ids: np.ndarray, g: torch.Tensor):
        p = self.params[name]
        if name in self._acc:
            ids0, g0 = self._acc[name]
            allv = np.concatenate([ids0, ids])
            u, inv = _pstrain.unique_inverse(allv)
            acc = torch.zeros(len(u), g.shape[1])
            acc.index_add_(0, torch.from_numpy(inv), torch.cat([p.grad if p.grad is not None else g0, g]))
            ids, g = u, acc
        else:
            g = g.clone()
        self._acc[name] = (ids, g)
        p.data = torch.empty(len(ids), g.shape[1])
        p.grad = g

    def step_accumulated(self):
        """``fused=False``: pushes the gradients accumulated since the last ``zero_grad`` (as the optimizer
        handle's parameters hold them now: unscaled or clipped in place by the caller)."""
        update = {}
        for name, (ids, _) in self._acc.items():
            g = self.params[name].grad
            if g is None or not len(ids):
                continue
            g = g.detach().to(torch.float32).contiguous().numpy()
            if not np.isfinite(g).all():
                raise ValueError(f"table {name!r}: the accumulated gradient is not finite (unscale with the "
                                 "GradScaler, which skips such steps: scaler.step(optimizer))")
            update[name] = (ids, g)
        if update:
            self.submit(update)

    def zero_accumulated(self):
        self._acc.clear()
        for p in self.params.values():
            p.grad = None
            p.data = torch.empty(0, p.shape[1])

    def submit(self, update: Dict[str, Tuple[np.ndarray, np.ndarray]]):
        """Pushes one update (per table: distinct ids and their summed gradients, finite), one request per server,
        dimension and push encoding, on the lane; logs it for replay."""
        parts: Dict[Tuple[int, str], List[str]] = {}
        for name in update:
            t = self.tables[name]
            parts.setdefault((t.dim, t.push_encoding), []).append(name)
        for names in parts.values():
            g = np.concatenate([np.asarray(update[n][1], dtype=np.float32) for n in names]) if len(names) > 1 \
                else np.ascontiguousarray(update[names[0]][1], dtype=np.float32)
            bad = self._push(names, [update[n][0] for n in names], g, 1.0)
            if bad is not None:
                r, c, v = bad
                raise ValueError(f"row {r} column {c} of the update is {v}: gradients must be finite")

    def _push(self, names: List[str], ids: List[np.ndarray], g: np.ndarray, divisor: float):
        """Pushes ``g`` (``sum(len(ids)) x dim``, the tables' rows one table after another; tables of one
        dimension and push encoding) divided by ``divisor``, one request per server and learning-rate multiplier,
        on the lane; logs it for replay while batches are prefetched. Returns ``(row, column, value)`` of the first
        value that is not finite (then nothing is pushed), else None."""
        start = time.perf_counter()
        self._check_lrs()
        lrs = {g["table"]: g["lr"] for g in self.optimizer.param_groups}
        ts = [self.tables[n] for n in names]
        keys, at = [], 0
        for t, i in zip(ts, ids):
            keys.append((t.id, t.dim, at))
            at += len(i)
        what = "tables " + ", ".join(repr(n) for n in names) if len(names) < 5 else f"{len(names)} tables"
        # The servers apply each table's optimizer at its registered rate times the multiplier its param group's
        # lr asks for; the ids are the plan's (uint64, distinct): straight to the extension.
        handles, bad = self.client._c.push_group(keys, what, ts[0].push_encoding, ids, g,
                                                 [self._lr_scale(n, lrs) for n in names], divisor, self.lane,
                                                 self._log if self._prefetched else None)
        self.timing["push"] += time.perf_counter() - start
        if bad is not None:
            return bad
        self._inflight.append((self.updates, handles))
        self.updates += 1
        return None

    def wait_pushes(self, keep: int):
        """Waits until only the pushes of the last ``keep`` updates are unacknowledged (raising their errors)."""
        start = time.perf_counter()
        while self._inflight and self._inflight[0][0] < self.updates - keep:
            for h in self._inflight.popleft()[1]:
                h.wait()
        self.timing["push_wait"] += time.perf_counter() - start

    # ---- whole tables ----

    def read_table(self, name: str) -> torch.Tensor:
        """Every row ``0 .. num_embeddings`` of table ``name``, pulled in pages of ``PAGE_ROWS``."""
        s, t = self.specs[name], self.tables[name]
        self.wait_pushes(0)
        out = torch.empty(s.num_embeddings, s.dim)
        for a in range(0, s.num_embeddings, PAGE_ROWS):
            b = min(a + PAGE_ROWS, s.num_embeddings)
            out[a:b] = torch.from_numpy(self.client.pull(t, np.arange(a, b, dtype=np.uint64)))
        return out

    def write_table(self, name: str, rows: torch.Tensor, what: str):
        """Sets rows ``0 .. num_embeddings`` of ``name`` to ``rows``, in pages (``Client.write``): the weights;
        each row's optimizer state on the servers is kept (as TorchRec's ``load_state_dict`` keeps its fused
        optimizer's state), and rows not yet created get the initial state."""
        s, t = self.specs[name], self.tables[name]
        if tuple(rows.shape) != (s.num_embeddings, s.dim):
            raise ValueError(f"{what}: shape {tuple(rows.shape)}, expected ({s.num_embeddings}, {s.dim}) for table "
                             f"{name!r}")
        rows = rows.detach().to("cpu", torch.float32).contiguous().numpy()
        finite = np.isfinite(rows)
        if not finite.all():
            r, c = np.argwhere(~finite)[0]
            raise ValueError(f"{what}: table {name!r} row {r} column {c} is {rows[r, c]}: weights must be finite")
        self.wait_pushes(0)
        for a in range(0, s.num_embeddings, PAGE_ROWS):
            b = min(a + PAGE_ROWS, s.num_embeddings)
            self.client.write(t, np.arange(a, b, dtype=np.uint64), rows[a:b])


class EmbeddingOptimizer(torch.optim.Optimizer):
    """The per-table handle of a collection's server-side optimizers, a ``torch.optim.Optimizer`` (TorchRec's
    ``fused_optimizer``): one param group per table (``table``, ``optimizer``, ``lr``), so learning rate
    schedulers and ``GradScaler`` work with it. With ``fused=True`` the updates happen in backward and
    ``step()`` does nothing; with ``fused=False`` each group's parameter holds the table's gradient of the
    steps since ``zero_grad()`` (distinct ids of those steps, summed), and ``step()`` pushes it."""

    def __init__(self, engine: Lookup):
        self._engine = engine
        groups = [dict(params=[engine.params[n]], lr=s.lr, table=n, optimizer=s.optimizer)
                  for n, s in engine.specs.items()]
        super().__init__(groups, dict(lr=0.01))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._engine.fused:
            self._engine.step_accumulated()
        return loss

    def zero_grad(self, set_to_none: bool = True):
        self._engine.zero_accumulated()
