"""PyTorch layer: embedding tables on the parameter servers as an ``nn.Module``.

``EmbeddingCollection`` takes a :class:`JaggedFeatures` batch (keys, values, lengths and optional per-id
weights: the layout of TorchRec's ``KeyedJaggedTensor``, without a TorchRec dependency; ``pstrain.torchrec`` takes
TorchRec's own types) and returns, per feature, the pooled rows (``sum`` or ``mean``: ``[batch, dim]``) or the
unpooled rows (``none``: ``[len(values of the key), dim]``).

Example::

    import pstrain, torch
    from pstrain.torch import EmbeddingCollection, EmbeddingTable, JaggedFeatures
    with pstrain.LocalCluster(servers=2) as cluster, pstrain.Client(cluster.servers, cluster.tls_dir) as client:
        emb = EmbeddingCollection(client, [EmbeddingTable("item", 16, features=["item", "history"],
                                                          optimizer="row_adagrad", lr=0.05)], staleness=2)
        batch = JaggedFeatures.from_lists({"item": [[3], [7]], "history": [[1, 2, 3], []]})
        out = emb(batch)                    # {"item": [2, 16], "history": [2, 16]}
        (out["item"] * out["history"]).sum().backward()   # the gradients go to the servers

How a step pulls, replays and pushes (the same engine as ``pstrain.torchrec``): ``pstrain._lookup``. The
servers run the tables' optimizers; the dense part of a model is any torch module with any torch optimizer.
``prefetch(next_batch)`` starts the next batch's pulls so they overlap this batch's compute; replay of this
collection's own pushes keeps the rows exactly those of a synchronous run, at any staleness.
"""

from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
from dataclasses import dataclass, field

from .client import Client, _check_ids
from ._lookup import POOLINGS, Batch, EmbeddingOptimizer, Lookup, TableSpec


class JaggedFeatures:
    """A batch of sparse features: for each key, each sample's list of ids.

    ``values``: every id, key-major then sample-major (all of key 0's samples, then key 1's, ...);
    ``lengths``: ``len(keys) * batch_size`` counts in the same order; ``weights``: optional per-id float weights
    (weighted pooling), like ``values``. Ids are uint64, int64 (a negative int64 is the bit pattern of an id at
    or above 2^63: ``uint64_tensor.view(torch.int64)``) or int32, as numpy arrays or torch tensors."""

    def __init__(self, keys: Sequence[str], values, lengths, weights=None):
        self.keys = list(keys)
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"JaggedFeatures: duplicate keys in {self.keys}")
        self.device = values.device if isinstance(values, torch.Tensor) else None
        self.values = _ids_to_numpy(values, "JaggedFeatures values")
        self.lengths = _to_numpy(lengths, "lengths").astype(np.int64, copy=False)
        self.weights = None
        if weights is not None:
            if isinstance(weights, torch.Tensor):
                weights = weights.detach().to("cpu", torch.float32).numpy()
            self.weights = np.ascontiguousarray(weights, dtype=np.float32)
            if self.weights.shape != self.values.shape:
                raise ValueError(f"JaggedFeatures: weights shape {self.weights.shape}, values shape {self.values.shape}")
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
        ids = _ids_to_numpy(ids, "ids")
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

    def key_weights(self, key: str) -> Optional[np.ndarray]:
        """The per-id weights of one key, or ``None``."""
        if self.weights is None:
            return None
        self.key(key)
        i = self._index[key]
        return self.weights[self._bounds[i] : self._bounds[i + 1]]

    def batch(self, features: Sequence[str]) -> Batch:
        """The engine's view of the features ``features`` (ids as uint64, checked)."""
        ids, lengths, weights = {}, {}, {}
        for f in features:
            v, l = self.key(f)
            ids[f] = _check_ids(v, f"feature {f!r}", negative_as_bits=True)
            lengths[f] = l
            weights[f] = self.key_weights(f)
        return Batch(list(features), self.batch_size, ids, lengths, weights, source=self, device=self.device)


def _to_numpy(x, what: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{what}: tensor dtype {x.dtype}: expected torch.int64")
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"{what}: expected a numpy array or a torch tensor, got {type(x).__name__}")


def _ids_to_numpy(x, what: str) -> np.ndarray:
    """Ids as a numpy array: torch ``uint64`` (what a DataLoader makes of ``read_criteo``'s ids), ``int64`` (a
    negative value is the bit pattern of an id at or above 2^63) and ``int32`` tensors, or numpy arrays."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype == torch.uint64:
            return x.view(torch.int64).cpu().numpy().view(np.uint64)
        if x.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{what}: tensor dtype {x.dtype}: expected torch.int64, torch.uint64 or torch.int32")
        return x.cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"{what}: expected a numpy array or a torch tensor, got {type(x).__name__}")


@dataclass
class EmbeddingTable:
    """One table of an :class:`EmbeddingCollection`: ``features`` are the keys it serves (default: its name);
    ``pooling`` is ``sum``, ``mean`` or ``none``; ``num_embeddings`` (optional) bounds its ids and lets
    ``state_dict()`` hold its rows; the remaining settings go to :meth:`Client.register_table` (optimizer and
    learning rate, initializer and seed, encodings)."""

    name: str
    dim: int
    features: List[str] = field(default_factory=list)
    pooling: str = "sum"
    optimizer: str = "sgd"
    lr: float = 0.01
    options: dict = field(default_factory=dict)
    num_embeddings: Optional[int] = None

    def __post_init__(self):
        if not self.features:
            self.features = [self.name]
        if self.pooling not in POOLINGS:
            raise ValueError(f"table {self.name!r}: pooling = {self.pooling!r}, expected one of {POOLINGS}")


class EmbeddingCollection(nn.Module):
    """Tables on the parameter servers, looked up by feature.

    ``client``: a connected :class:`pstrain.Client`; ``tables``: :class:`EmbeddingTable` specs, registered on the
    servers here; ``staleness``: updates whose pushes may be unacknowledged when a step computes (0: none; the
    rows a step computes with are the same for every value, see ``pstrain._lookup``); ``fused``: push in
    backward (default) or accumulate until ``optimizer.step()``; ``grad_scaler``: the ``torch.amp.GradScaler``
    of a mixed-precision loop (fused only: gradients are unscaled, non-finite steps skipped).

    Tables of one dimension and encoding form a group: each step pulls a group's distinct ids in one request per
    server into one buffer, which enters the graph as one tensor; backward pushes the group's gradients in one
    request per server. ``state_dict()`` holds the rows of tables with ``num_embeddings`` as
    ``tables.<name>.weight`` (pulled in pages); it refuses, naming the table, to leave out a table without."""

    def __init__(self, client: Client, tables: Sequence[EmbeddingTable], staleness: int = 0, fused: bool = True,
                 grad_scaler=None):
        """Registers ``tables`` on the servers of ``client``; the arguments are described on the class."""
        super().__init__()
        self.client = client
        self.specs = list(tables)
        specs = [TableSpec(t.name, t.dim, list(t.features), t.pooling, t.optimizer, t.lr, dict(t.options),
                           t.num_embeddings) for t in self.specs]
        self._engine = Lookup(client, specs, staleness=staleness, fused=fused, grad_scaler=grad_scaler)
        self.staleness = self._engine.staleness

    @property
    def steps(self) -> int:
        """Forward passes so far."""
        return self._engine.steps

    @property
    def features(self) -> List[str]:
        return list(self._engine.feature_table)

    @property
    def optimizer(self) -> EmbeddingOptimizer:
        """The per-table optimizer handle (param group per table with ``lr``; see ``pstrain._lookup``)."""
        return self._engine.optimizer

    fused_optimizer = optimizer

    def prefetch(self, features: JaggedFeatures):
        """Starts the pulls of the batch ``features``; a later ``forward`` of the same object uses them. Up to
        four batches may be prefetched ahead (the oldest is dropped past that)."""
        b = features.batch(self.features)
        self._engine.check_ids(b)
        self._engine.prefetch(b)

    def forward(self, features: JaggedFeatures, stack: bool = False):
        """Per feature, the pooled rows ``[batch, dim]`` (or, with pooling ``none``, the rows of the feature's
        values). ``stack=True`` returns one ``[batch, features, dim]`` tensor instead, features in
        :attr:`features` order (every feature pooled, one dimension)."""
        b = features.batch(self.features)
        self._engine.check_ids(b)
        if stack:
            if any(self._engine.specs[self._engine.feature_table[k]].pooling == "none" for k in self.features):
                raise ValueError("forward(stack=True): a table has pooling 'none' (its rows per feature vary)")
            return self._engine.lookup(b, stack=self.features)
        return self._engine.lookup(b)

    def wait(self):
        """Waits until every push so far is acknowledged (raising the first error)."""
        self._engine.wait_pushes(0)

    def flush(self) -> int:
        """Waits for every push, then has the servers write their dirty rows to RocksDB."""
        self._engine.wait_pushes(0)
        return self.client.flush()

    def checkpoint(self, directory: str, step: Optional[int] = None):
        """Waits for every push, then snapshots every server's tables (rows and optimizer state) under
        ``directory``; ``pstrain.LocalCluster(restore_from=directory)`` or ``ps-server restore`` restores it."""
        self._engine.wait_pushes(0)
        return self.client.checkpoint(directory, self.steps if step is None else step)

    def stats(self) -> dict:
        """The client's counters plus this layer's: steps, updates, and seconds spent planning, waiting for
        pulls, replaying, submitting pushes and waiting for pushes (``layer_wait_seconds``: both waits)."""
        return _stats(self.client, self._engine)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, s in self._engine.specs.items():
            if s.num_embeddings is None:
                raise RuntimeError(
                    f"state_dict: table {name!r} has no num_embeddings, so its rows cannot be listed: give the "
                    "EmbeddingTable num_embeddings (ids below it), or save it with checkpoint(dir)")
            destination[f"{prefix}tables.{name}.weight"] = self._engine.read_table(name)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        for name in self._engine.specs:
            key = f"{prefix}tables.{name}.weight"
            if key in state_dict:
                self._engine.write_table(name, state_dict[key], f"load_state_dict {key}")
            elif strict:
                missing_keys.append(key)

    def __reduce_ex__(self, protocol):
        raise TypeError(_NO_PICKLE.format(type(self).__name__))

    def __deepcopy__(self, memo):
        raise TypeError(_NO_PICKLE.format(type(self).__name__))


_NO_PICKLE = ("{} holds a connection to the parameter servers and cannot be pickled or deep-copied: save "
              "model.state_dict() (it holds the tables' rows) or checkpoint(dir), and build the model anew with a "
              "Client where it is loaded")


def _stats(client: Client, engine: Lookup) -> dict:
    s = dict(client.stats())
    t = engine.timing
    s.update(steps=engine.steps, updates=engine.updates, skipped_updates=engine.skipped_updates,
             plan_seconds=t["plan"], pull_wait_seconds=t["pull_wait"], replay_seconds=t["replay"],
             push_submit_seconds=t["push"], push_wait_seconds=t["push_wait"],
             layer_wait_seconds=t["pull_wait"] + t["push_wait"])
    return s
