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
            base = 0
            for name in group:
                spec = engine.specs[name]
                parts = [batch.ids[f] for f in spec.features]
                allv = np.concatenate(parts) if len(parts) > 1 else parts[0]
                u, inv = _pstrain.unique_inverse(allv)
                self.unique[name] = u
                inv += base
                at = 0
                for f, part in zip(spec.features, parts):
                    self.inverse[f] = inv[at : at + len(part)]
                    at += len(part)
                base += len(u)
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
        self.lane = _pstrain.Lane()
        # A tensor that requires grad, so the pulled rows join the graph (not a Parameter: no optimizer sees it).
        self._anchor = torch.zeros(0, requires_grad=True)
        self._prefetched: deque = deque()  # plans of prefetched batches, oldest first (at most MAX_PREFETCHED)
        # (lane seq, {table: (distinct ids, gradients as pushed)}) of pushes a prefetched pull may lack.
        self._log: deque = deque()
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
            plan.handles[group] = self.client.pull_many(
                [self.tables[n] for n in group], [plan.unique[n] for n in group], lane=self.lane,
                with_state=with_state)

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

    def lookup(self, batch: Batch, stack: Optional[List[str]] = None):
        """Per feature of ``batch`` served here: pooled rows ``[batch, dim]``, or for pooling ``none`` the rows
        of its ids ``[len(ids), dim]``; in the graph when grad is enabled. With ``stack`` (feature names, all
        pooled, one dimension): one ``[batch, len(stack), dim]`` tensor in that order instead."""
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
        self._picked = None
        grad = torch.is_grad_enabled()
        for group in self.groups:
            start = time.perf_counter()
            h = plan.handles[group]
            rows = h.wait(concat=True)
            self.timing["pull_wait"] += time.perf_counter() - start
            if plan.with_state:
                start = time.perf_counter()
                self._replay(group, plan, rows, h.take_state(), h.seq)
                self.timing["replay"] += time.perf_counter() - start
            weight = torch.from_numpy(rows)
            if grad:
                weight = _PulledRows.apply(self._anchor, _Holder(weight), self, group,
                                           [plan.unique[n] for n in group])
            self._gather(group, plan, weight, out)
        self._trim_log()
        if stack is not None:
            if self._picked is not None and self._picked[0] == list(stack) and len(self.groups) == 1:
                # Every feature one-hot in one group: the gathered rows are [features x batch] already.
                res = self._picked[1].view(len(stack), batch.batch_size, -1).transpose(0, 1)
            else:
                res = torch.stack([out[k] for k in stack], dim=1)
            return res.to(batch.device) if batch.device is not None and batch.device.type != "cpu" else res
        if batch.device is not None and batch.device.type != "cpu":
            out = {k: v.to(batch.device) for k, v in out.items()}
        return out

    def _gather(self, group, plan: _Plan, weight: torch.Tensor, out: Dict[str, torch.Tensor]):
        batch = plan.batch
        direct, bags = [], []
        for name in group:
            spec = self.specs[name]
            for f in spec.features:
                lengths = batch.lengths[f]
                one_hot = (len(plan.inverse[f]) == len(lengths) and batch.weights.get(f) is None
                           and bool((lengths == 1).all()))
                (direct if spec.pooling == "none" or one_hot else bags).append(f)
        if direct:
            inv = np.concatenate([plan.inverse[f] for f in direct]) if len(direct) > 1 else plan.inverse[direct[0]]
            picked = weight.index_select(0, torch.from_numpy(inv))
            if not bags:
                self._picked = (direct, picked)
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

    def _replay(self, group, plan: _Plan, rows: np.ndarray, state: np.ndarray, pull_seq: int):
        """Applies this collection's updates entered after the group's pull to its rows."""
        later = [(seq, u) for seq, u in self._log if seq > pull_seq]
        if not later:
            return
        at_r, at_s = 0, 0
        for name in group:
            t = self.tables[name]
            n = len(plan.unique[name])
            sl = self.client._c.state_len(t.id)
            r = rows[at_r : at_r + n]
            s = state[at_s : at_s + n * sl].reshape(n, sl)
            for _, u in later:
                if name in u:
                    ids, g, lr_scale = u[name]
                    self.client._c.replay(t.id, r, s, plan.unique[name], ids, g, lr_scale)
            at_r += n
            at_s += n * sl

    def _trim_log(self):
        oldest = min((h.seq for p in self._prefetched for h in p.handles.values()), default=None)
        while self._log and (oldest is None or self._log[0][0] < oldest):
            self._log.popleft()

    # ---- backward and push ----

    def _backward(self, group, uniques, grad: torch.Tensor):
        g = grad.detach().to(torch.float32)
        if self.fused:
            if self.grad_scaler is not None and self.grad_scaler.is_enabled():
                g = g / float(self.grad_scaler.get_scale())
            if not torch.isfinite(g).all():
                if self.grad_scaler is not None:
                    # GradScaler's contract: a step with inf/NaN gradients is skipped (the scale then drops).
                    self.skipped_updates += 1
                    return
                r, c = (~torch.isfinite(g)).nonzero()[0].tolist()
                name, at = self._row_table(group, uniques, r)
                raise ValueError(f"table {name!r}: gradient of id {int(uniques[group.index(name)][at])} column {c} is "
                                 f"{g[r, c].item()}: gradients must be finite (with AMP, pass grad_scaler=)")
            g = g.contiguous().numpy()
            update, at = {}, 0
            for name, u in zip(group, uniques):
                update[name] = (u, g[at : at + len(u)])
                at += len(u)
            self.submit(update)
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
        """Pushes one update (per table: distinct ids and their summed gradients), one request per server and
        push encoding, on the lane; logs it for replay."""
        start = time.perf_counter()
        self._check_lrs()
        lrs = {g["table"]: g["lr"] for g in self.optimizer.param_groups}
        # One request per server for every (push encoding, learning-rate multiplier): the servers apply each
        # table's optimizer at its registered rate times the multiplier the param group's lr asks for.
        by_enc: Dict[Tuple[str, float], list] = {}
        for name, (ids, g) in update.items():
            key = (self.tables[name].push_encoding, self._lr_scale(name, lrs))
            by_enc.setdefault(key, []).append((name, ids, g))
        handles = []
        for (enc, lr_scale), parts in by_enc.items():
            # The ids are the plan's (uint64, distinct) and the gradients were checked finite in backward: straight
            # to the extension, without the public API's checks.
            ts = [self.tables[n] for n, _, _ in parts]
            what = "tables " + ", ".join(repr(t.name) for t in ts) if len(ts) < 5 else f"{len(ts)} tables"
            h = self.client._c.push_async([(t.id, t.dim) for t in ts], what, enc, [i for _, i, _ in parts],
                                          [np.ascontiguousarray(g, dtype=np.float32) for _, _, g in parts], self.lane,
                                          lr_scale=lr_scale)
            handles.append(h)
            if self._prefetched:
                self._log.append((h.seq, {n: (i, g, lr_scale) for n, i, g in parts}))
        self._inflight.append((self.updates, handles))
        self.updates += 1
        self.timing["push"] += time.perf_counter() - start

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
