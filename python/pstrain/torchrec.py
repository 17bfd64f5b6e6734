"""TorchRec's embedding modules with their tables on the parameter servers.

``EmbeddingBagCollection`` and ``EmbeddingCollection`` are built from TorchRec's ``EmbeddingBagConfig`` /
``EmbeddingConfig`` lists, take a ``torchrec.KeyedJaggedTensor`` (per-id ``weights`` included: weighted
pooling) and return a ``KeyedTensor`` / ``Dict[str, JaggedTensor]``, like ``torchrec.EmbeddingBagCollection`` and
``torchrec.EmbeddingCollection``; so a TorchRec model trains unchanged through the servers::

    import pstrain, torch
    from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.models.dlrm import DLRM
    from pstrain.torchrec import EmbeddingBagCollection

    with pstrain.LocalCluster(servers=2) as cluster, pstrain.Client(cluster.servers, cluster.tls_dir) as client:
        tables = [EmbeddingBagConfig(name=f"t_{f}", embedding_dim=16, num_embeddings=100_000, feature_names=[f])
                  for f in ["user", "item"]]
        ebc = EmbeddingBagCollection(tables, client, optimizer="row_adagrad", lr=0.05, staleness=2)
        model = DLRM(embedding_bag_collection=ebc, dense_in_features=13, dense_arch_layer_sizes=[64, 16],
                     over_arch_layer_sizes=[64, 1])
        opt = torch.optim.Adam(model.parameters())       # the dense part; the tables' optimizers run on the servers
        ...
        logits = model(dense, kjt); loss = ...; loss.backward(); opt.step()

What the servers do and what a step costs: ``pstrain._lookup`` (pull on the collection's lane, replay of its own
pushes, push in backward or at ``fused_optimizer.step()``). Differences from TorchRec's modules, each on purpose:

- the tables' optimizer runs on the servers (TorchRec's ``FusedEmbeddingBagCollection`` semantics): the module
  has no ``nn.Parameter``; ``fused_optimizer`` is the per-table handle (``param_groups[i]["lr"]``);
- rows start from the servers' initializer: uniform in ``[weight_init_min, weight_init_max]`` (TorchRec's
  default ``±sqrt(1 / num_embeddings)``) with a symmetric range, or ``init="normal"`` in the options, seeded by
  table name; a custom ``init_fn`` is refused (it cannot run on the servers);
- ``state_dict()`` holds ``embedding_bags.<table>.weight`` / ``embeddings.<table>.weight`` of
  ``[num_embeddings, dim]`` like TorchRec's (pulled in pages), so it loads into TorchRec's own modules too;
  ``load_state_dict`` writes the rows back into every table (the weights; the servers keep each row's optimizer
  state, as TorchRec keeps its fused optimizer's; restore a ``checkpoint()`` to bring the state back too);
- ids must be below the table's ``num_embeddings`` (TorchRec indexes out of bounds otherwise): refused, naming
  the feature and the id (``check_ids=False`` lets any 64-bit id through: the servers' tables are hash maps).
"""

import functools
import json
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn as nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import get_embedding_names_by_table
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

from ._lookup import Batch, EmbeddingOptimizer, Lookup, TableSpec
from .client import Client, _check_ids
from .torch import _NO_PICKLE, _stats

__all__ = ["EmbeddingBagCollection", "EmbeddingCollection", "kjt_batch", "export_dlrm"]

_POOLING = {PoolingType.SUM: "sum", PoolingType.MEAN: "mean"}


def _init_options(cfg) -> dict:
    """The servers' initializer for a TorchRec config: its uniform range, or refused naming the table."""
    fn = cfg.init_fn
    lo, hi = cfg.get_weight_init_min(), cfg.get_weight_init_max()
    if fn is not None:
        if not (isinstance(fn, functools.partial) and fn.func is torch.nn.init.uniform_
                and fn.keywords.get("a") == lo and fn.keywords.get("b") == hi):
            raise ValueError(
                f"table {cfg.name!r}: init_fn {fn!r} cannot run on the parameter servers: leave init_fn unset "
                "(uniform in [weight_init_min, weight_init_max]) or pass init='normal', init_scale=... in the "
                "table's options")
    if not np.isclose(lo, -hi):
        raise ValueError(f"table {cfg.name!r}: weight_init_min {lo} and weight_init_max {hi}: the servers' uniform "
                         "initializer is symmetric (min = -max)")
    return dict(init="uniform", init_scale=float(hi))


def _specs(tables, table_options, defaults, pooled: bool, prefix: str) -> List[TableSpec]:
    specs = []
    table_options = dict(table_options or {})
    names = {t.name for t in tables}
    for unknown in set(table_options) - names:
        raise KeyError(f"table_options: no table {unknown!r} (tables are {sorted(names)})")
    for t in tables:
        if not t.name:
            raise ValueError(f"a table config without a name: {t!r}")
        if not t.feature_names:
            t.feature_names = [t.name]
        opts = dict(defaults)
        opts.update(_init_options(t) if "init" not in table_options.get(t.name, {}) else {})
        opts.update(table_options.get(t.name, {}))
        optimizer, lr = opts.pop("optimizer"), opts.pop("lr")
        if pooled:
            if t.pooling not in _POOLING:
                raise ValueError(f"table {t.name!r}: pooling {t.pooling}: expected SUM or MEAN")
            pooling = _POOLING[t.pooling]
        else:
            pooling = "none"
        specs.append(TableSpec(prefix + t.name, t.embedding_dim, list(t.feature_names), pooling, optimizer, lr,
                               opts, t.num_embeddings))
    return specs


def kjt_batch(kjt: KeyedJaggedTensor, features: Sequence[str], weighted: bool) -> Batch:
    """The engine's view of ``features`` of ``kjt``, checked: every feature present, integer ids (int64, int32 or
    uint64; a negative int64 is the bit pattern of an id at or above 2^63), lengths that add up to the values,
    weights beside the values when ``weighted``. Every error names the problem."""
    if not isinstance(kjt, KeyedJaggedTensor):
        raise TypeError(f"expected a torchrec.KeyedJaggedTensor, got {type(kjt).__name__}")
    keys = kjt.keys()
    index = {k: i for i, k in enumerate(keys)}
    missing = [f for f in features if f not in index]
    if missing:
        raise KeyError(f"KeyedJaggedTensor has no feature {missing[0]!r} (its keys are {keys}; this module serves "
                       f"{list(features)})")
    if kjt.variable_stride_per_key():
        raise ValueError("KeyedJaggedTensor with a variable batch size per key: not supported (one stride for "
                         "every key)")
    values = kjt.values()
    if values.dtype not in (torch.int64, torch.int32, torch.uint64):
        raise TypeError(f"KeyedJaggedTensor values dtype {values.dtype}: expected torch.int64, torch.int32 or "
                        "torch.uint64 ids")
    lengths = kjt.lengths().detach()
    if lengths.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"KeyedJaggedTensor lengths dtype {lengths.dtype}: expected an integer tensor")
    b = kjt.stride()
    if lengths.numel() != b * len(keys):
        raise ValueError(f"KeyedJaggedTensor: {lengths.numel()} lengths for {len(keys)} keys x batch {b}")
    lengths = lengths.to("cpu", torch.int64).numpy()
    if (lengths < 0).any():
        i = int(np.argmax(lengths < 0))
        raise ValueError(f"KeyedJaggedTensor: length {int(lengths[i])} of key {keys[i // b]!r} sample {i % b} is "
                         "negative")
    total = int(lengths.sum())
    if total != values.numel():
        raise ValueError(f"KeyedJaggedTensor: lengths sum to {total}, but there are {values.numel()} values")
    weights = kjt.weights_or_none()
    if weighted:
        if weights is None:
            raise ValueError("KeyedJaggedTensor has no weights, but the module is weighted (is_weighted=True)")
        if weights.numel() != values.numel():
            raise ValueError(f"KeyedJaggedTensor: {weights.numel()} weights for {values.numel()} values")
        weights = weights.detach().to("cpu", torch.float32).numpy()
    if values.dtype == torch.uint64:
        vals = values.detach().view(torch.int64).cpu().numpy().view(np.uint64)
    else:
        vals = values.detach().cpu().numpy()
    bounds = np.concatenate([[0], np.cumsum(lengths.reshape(len(keys), b).sum(axis=1))])
    ids, lens, ws = {}, {}, {}
    for f in features:
        i = index[f]
        a, z = int(bounds[i]), int(bounds[i + 1])
        ids[f] = _check_ids(np.ascontiguousarray(vals[a:z]), f"feature {f!r}", negative_as_bits=True)
        lens[f] = lengths[i * b : (i + 1) * b]
        ws[f] = np.ascontiguousarray(weights[a:z]) if weighted else None
    return Batch(list(features), b, ids, lens, ws, source=kjt, device=values.device)


class _Collection(nn.Module):
    """What both modules share: the engine, prefetch, waits, stats, state_dict, pickling refused."""

    _weight_prefix = ""

    def _setup(self, client, specs, staleness, fused, grad_scaler, check_ids, prefix):
        if not isinstance(client, Client):
            raise TypeError(f"client: expected a pstrain.Client, got {type(client).__name__}")
        self.client = client
        self._prefix = prefix
        self._check = check_ids
        self._engine = Lookup(client, specs, staleness=staleness, fused=fused, grad_scaler=grad_scaler)
        self._features = list(self._engine.feature_table)

    @property
    def fused_optimizer(self) -> EmbeddingOptimizer:
        """The per-table optimizer handle: a ``torch.optim.Optimizer`` with one param group per table
        (``table``, ``optimizer``, ``lr``); add it to a TorchRec ``CombinedOptimizer`` or give it an LR
        scheduler. With ``fused=False`` its ``step()`` pushes the accumulated gradients."""
        return self._engine.optimizer

    @property
    def staleness(self) -> int:
        return self._engine.staleness

    def _batch(self, kjt) -> Batch:
        b = kjt_batch(kjt, self._features, self._weighted)
        if self._check:
            self._engine.check_ids(b)
        return b

    def prefetch(self, features: KeyedJaggedTensor):
        """Starts the pulls of the batch ``features`` (the same object goes to ``forward`` later), so they
        overlap the current step; up to four batches ahead."""
        self._engine.prefetch(self._batch(features))

    def wait(self):
        """Waits until every push so far is acknowledged (raising the first error)."""
        self._engine.wait_pushes(0)

    def flush(self) -> int:
        """Waits for every push, then has the servers write their dirty rows to RocksDB."""
        self._engine.wait_pushes(0)
        return self.client.flush()

    def checkpoint(self, directory: str, step: Optional[int] = None):
        """Waits for every push, then snapshots every server's tables (rows and optimizer state) under
        ``directory`` (on the servers' file system); ``pstrain.LocalCluster(restore_from=directory)`` or
        ``ps-server restore`` brings it back."""
        self._engine.wait_pushes(0)
        return self.client.checkpoint(directory, self._engine.steps if step is None else step)

    def stats(self) -> dict:
        """The client's counters and this module's steps, updates, and seconds spent planning, waiting for
        pulls, replaying, submitting and waiting for pushes: the per-step cost of the PS path."""
        return _stats(self.client, self._engine)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for cfg in self._configs:
            destination[f"{prefix}{self._weight_prefix}.{cfg.name}.weight"] = self._engine.read_table(
                self._prefix + cfg.name)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        for cfg in self._configs:
            key = f"{prefix}{self._weight_prefix}.{cfg.name}.weight"
            if key in state_dict:
                self._engine.write_table(self._prefix + cfg.name, state_dict[key], f"load_state_dict {key}")
            elif strict:
                missing_keys.append(key)

    def __reduce_ex__(self, protocol):
        raise TypeError(_NO_PICKLE.format(type(self).__name__))

    def __deepcopy__(self, memo):
        raise TypeError(_NO_PICKLE.format(type(self).__name__))


class EmbeddingBagCollection(_Collection):
    """Pooled embeddings of TorchRec ``EmbeddingBagConfig`` tables on the parameter servers: a
    ``KeyedJaggedTensor`` in, a ``KeyedTensor`` (``[batch, sum of dims]``, keys in config order) out.

    ``tables``: TorchRec configs (name, ``embedding_dim``, ``num_embeddings``, ``feature_names``, ``pooling``
    SUM or MEAN, init range); ``client``: a :class:`pstrain.Client`; ``is_weighted``: pool with the KJT's
    per-id weights; ``optimizer``/``lr`` and further ``Client.register_table`` options (``eps``,
    ``encoding``, ``seed``...) apply to every table, ``table_options={name: {...}}`` per table;
    ``staleness``, ``fused``, ``grad_scaler``: see ``pstrain._lookup``; ``table_prefix``: prepended to the
    table names on the servers (tables are cluster-wide: two models with a table of one name share it);
    ``device``: where outputs go (default: the input's device)."""

    _weight_prefix = "embedding_bags"

    def __init__(self, tables: List[EmbeddingBagConfig], client: Client, *, is_weighted: bool = False,
                 device: Optional[torch.device] = None, optimizer: str = "sgd", lr: float = 0.01,
                 table_options: Optional[Dict[str, dict]] = None, staleness: int = 0, fused: bool = True,
                 grad_scaler=None, check_ids: bool = True, table_prefix: str = "", **options):
        """Registers ``tables`` on the servers of ``client`` (attaching to them if the cluster holds them with
        the same settings); the arguments are described on the class."""
        super().__init__()
        for t in tables:
            if not isinstance(t, EmbeddingBagConfig):
                raise TypeError(f"tables: expected torchrec EmbeddingBagConfig, got {type(t).__name__}")
        self._configs = list(tables)
        self._weighted = bool(is_weighted)
        self._device = torch.device(device) if device is not None else None
        specs = _specs(self._configs, table_options, dict(options, optimizer=optimizer, lr=lr), True, table_prefix)
        self._setup(client, specs, staleness, fused, grad_scaler, check_ids, table_prefix)
        self._embedding_names = [n for names in get_embedding_names_by_table(self._configs) for n in names]
        self._lengths = [t.embedding_dim for t in self._configs for _ in t.feature_names]
        self._flat = [f for t in self._configs for f in t.feature_names]
        if len(set(self._flat)) != len(self._flat):
            raise ValueError("a feature read by two tables: not supported (one table per feature)")

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """The pooled embeddings of every configured feature, as TorchRec's ``EmbeddingBagCollection``."""
        values = self._engine.lookup(self._batch(features), concat=self._flat)
        if self._device is not None:
            values = values.to(self._device)
        return KeyedTensor(keys=self._embedding_names, length_per_key=self._lengths, values=values)

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        return self._configs

    def is_weighted(self) -> bool:
        return self._weighted

    @property
    def device(self) -> torch.device:
        return self._device or torch.device("cpu")


class EmbeddingCollection(_Collection):
    """Unpooled embeddings of TorchRec ``EmbeddingConfig`` tables on the parameter servers (sequence features:
    user histories, with the ids of a table deduplicated across the batch and across the features sharing it):
    a ``KeyedJaggedTensor`` in, ``Dict[str, JaggedTensor]`` out (per feature, ``values`` ``[ids, dim]`` and the
    input's ``lengths``; its ``weights``, e.g. timestamps, are carried to the output's ``weights``, or the ids
    with ``need_indices=True``). Settings as :class:`EmbeddingBagCollection`."""

    _weight_prefix = "embeddings"

    def __init__(self, tables: List[EmbeddingConfig], client: Client, *, device: Optional[torch.device] = None,
                 need_indices: bool = False, optimizer: str = "sgd", lr: float = 0.01,
                 table_options: Optional[Dict[str, dict]] = None, staleness: int = 0, fused: bool = True,
                 grad_scaler=None, check_ids: bool = True, table_prefix: str = "", **options):
        """Registers ``tables`` on the servers of ``client``; the arguments are described on the class and on
        :class:`EmbeddingBagCollection`."""
        super().__init__()
        for t in tables:
            if not isinstance(t, EmbeddingConfig):
                raise TypeError(f"tables: expected torchrec EmbeddingConfig, got {type(t).__name__}")
        dims = {t.embedding_dim for t in tables}
        if len(dims) > 1:
            raise ValueError(f"EmbeddingCollection: tables of several embedding dims {sorted(dims)} (TorchRec's "
                             "EmbeddingCollection requires one)")
        self._configs = list(tables)
        self._need_indices = need_indices
        self._weighted = False
        self._device = torch.device(device) if device is not None else None
        specs = _specs(self._configs, table_options, dict(options, optimizer=optimizer, lr=lr), False, table_prefix)
        self._setup(client, specs, staleness, fused, grad_scaler, check_ids, table_prefix)
        self._names = get_embedding_names_by_table(self._configs)

    def forward(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        """Per configured feature, its ids' rows as a ``JaggedTensor`` (TorchRec's ``EmbeddingCollection``)."""
        b = self._batch(features)
        out = self._engine.lookup(b)
        weights = features.weights_or_none()
        res: Dict[str, JaggedTensor] = {}
        at = _key_bounds(features) if weights is not None or self._need_indices else None
        for cfg, names in zip(self._configs, self._names):
            for f, name in zip(cfg.feature_names, names):
                v = out[f] if self._device is None else out[f].to(self._device)
                lengths = torch.from_numpy(b.lengths[f]).to(v.device)
                w = None
                if self._need_indices:
                    a, z = at[f]
                    w = features.values()[a:z]
                elif weights is not None:
                    a, z = at[f]
                    w = weights[a:z]
                res[name] = JaggedTensor(values=v, lengths=lengths, weights=w)
        return res

    def embedding_configs(self) -> List[EmbeddingConfig]:
        return self._configs

    def need_indices(self) -> bool:
        return self._need_indices

    def embedding_dim(self) -> int:
        return self._configs[0].embedding_dim if self._configs else -1

    def embedding_names_by_table(self) -> List[List[str]]:
        return self._names

    @property
    def device(self) -> torch.device:
        return self._device or torch.device("cpu")


def _key_bounds(kjt: KeyedJaggedTensor):
    per_key = kjt.length_per_key()
    at, out = 0, {}
    for k, n in zip(kjt.keys(), per_key):
        out[k] = (at, at + n)
        at += n
    return out


# The servers' optimizer names as a model spec writes them (docs/model-spec.md).
_SPEC_OPTIMIZER = {"sgd": "sgd", "row_adagrad": "adagrad", "adam": "adam"}


def _is_relu(fn) -> bool:
    return fn is torch.relu or fn is torch.nn.functional.relu or isinstance(fn, nn.ReLU)


def _mlp_linears(arch: nn.Module, what: str, last_relu: bool) -> List[nn.Linear]:
    """The ``nn.Linear`` layers of a TorchRec ``DenseArch``/``OverArch`` in order, checked to be the model
    ps-serve computes: ReLU after every layer (``last_relu=False``: but the last), biases everywhere."""
    from torchrec.modules.mlp import Perceptron

    linears, acts = [], []
    for m in arch.modules():
        if isinstance(m, Perceptron):
            acts.append(m._activation_fn)
        elif isinstance(m, nn.Linear):
            linears.append(m)
    want = len(linears) if last_relu else len(linears) - 1
    if len(acts) != want or not all(_is_relu(a) for a in acts):
        raise ValueError(f"export_dlrm: the {what} is not {'all ReLU layers' if last_relu else 'ReLU layers then a linear one'}"
                         f" ({len(linears)} linear layers, activations {[getattr(a, '__name__', type(a).__name__) for a in acts]})")
    for i, l in enumerate(linears):
        if l.bias is None:
            raise ValueError(f"export_dlrm: layer {i} of the {what} has no bias")
    return linears


def export_dlrm(model: nn.Module, root: str, version: Optional[int] = None, *,
                columns: Optional[Dict[str, str]] = None, tokens: Optional[Dict[str, int]] = None,
                samples: int = 0, keep: int = 3) -> str:
    """Writes a TorchRec ``DLRM`` whose ``EmbeddingBagCollection`` is ours as an export ``ps-serve --export
    root`` loads (the trainer's format, docs/serving.md): the servers snapshot every table into it, the dense
    parameters and a model spec complete it. Returns the version directory (``root/v<version>``, version
    default: the collection's steps).

    What ps-serve then computes is this model on Criteo rows: dense features ``ln(1 + max(x, 0))`` (what
    ``read_criteo`` gives), and for each feature the ids TorchRec's Criteo pipeline uses, ``int(token or "0",
    16) % num_embeddings`` of its column (``read_criteo`` with ``"ids": "token"`` and ``hash_size =
    num_embeddings`` in the layout). ``columns`` maps feature names to Criteo columns (default: a feature
    named ``C1`` .. ``C26`` reads that column); ``tokens`` the most tokens per field of multi-hot features
    (default 1: one-hot). ``root`` must be on the servers' file system, inside their checkpoint root.

    Refused with ``TypeError``/``ValueError`` naming the reason: another model class (``DLRM_DCN``'s cross
    layers, ``DLRM_Projection``), a TorchRec collection instead of ours, weighted features, a feature without a
    column, tables without ``num_embeddings``, layers that are not DLRM's."""
    from torchrec.models.dlrm import DLRM

    if type(model) is not DLRM:
        raise TypeError(f"export_dlrm: {type(model).__name__} is not torchrec.models.dlrm.DLRM (ps-serve computes "
                        "DLRM's dot interaction)")
    ebc = model.sparse_arch.embedding_bag_collection
    if not isinstance(ebc, EmbeddingBagCollection):
        raise TypeError(f"export_dlrm: the model's collection is a {type(ebc).__module__}.{type(ebc).__name__}, not "
                        "pstrain.torchrec.EmbeddingBagCollection: its tables are not on the servers")
    if ebc.is_weighted():
        raise ValueError("export_dlrm: the collection is weighted; ps-serve's Criteo rows carry no per-id weights")
    engine = ebc._engine
    engine.wait_pushes(0)
    columns = dict(columns or {})
    tokens = dict(tokens or {})
    features = list(model.sparse_arch.sparse_feature_names)
    bottom = _mlp_linears(model.dense_arch, "dense arch", last_relu=True)
    top = _mlp_linears(model.over_arch, "over arch", last_relu=False)
    if bottom[0].in_features != 13:
        raise ValueError(f"export_dlrm: the dense arch reads {bottom[0].in_features} dense features; Criteo rows have "
                         "13 (I1..I13)")
    lines = ['name = "torchrec-dlrm"', "dense_inputs = 13",
             f"bottom_mlp = {[l.out_features for l in bottom]}", f"top_mlp = {[l.out_features for l in top]}",
             "", "[interaction]", 'kind = "dot"', ""]
    table_ids = []
    for f in features:
        col = columns.get(f, f)
        if not (isinstance(col, str) and col[:1] == "C" and col[1:].isdigit() and 1 <= int(col[1:]) <= 26):
            raise ValueError(f"export_dlrm: feature {f!r} reads no Criteo column: name it C1..C26 or pass "
                             f"columns={{{f!r}: 'C<n>'}}")
        name = engine.feature_table[f]
        s, t = engine.specs[name], engine.tables[name]
        if s.num_embeddings is None:
            raise ValueError(f"export_dlrm: table {name!r} has no num_embeddings (ids would not be "
                             "int(token, 16) % num_embeddings)")
        if t.id not in table_ids:
            table_ids.append(t.id)
        # json.dumps writes a valid TOML basic string whatever the table's name holds.
        lines += ["[[feature]]", f"column = {json.dumps(col)}", f"table = {json.dumps(name)}", f"dim = {s.dim}",
                  f"pooling = {json.dumps(s.pooling)}", f"tokens = {int(tokens.get(f, 1))}",
                  f"hash_size = {s.num_embeddings}", f"optimizer = {json.dumps(_SPEC_OPTIMIZER[s.optimizer])}",
                  f"lr = {float(s.lr)!r}", f"encoding = {json.dumps(t.encoding + '/' + t.push_encoding)}",
                  'ids = "token"', ""]
    n, d = len(features), bottom[-1].out_features
    # TorchRec's InteractionArch gives [dense, pairs (i < j) of [dense, sparse...] in row-major upper-triangle
    # order]; ours gives the pairs in the lower triangle's row order (model/src/interaction.rs): the top MLP's
    # first layer reads the same products in another order, so its columns are permuted to ours.
    upper = torch.triu_indices(n + 1, n + 1, offset=1).t().tolist()
    ours = {(small, large): k for k, (small, large) in
            enumerate((j, i) for i in range(1, n + 1) for j in range(i))}
    perm = list(range(d)) + [0] * len(upper)
    for p, (a, b) in enumerate(upper):
        perm[d + ours[(a, b)]] = d + p
    params = []
    with torch.no_grad():
        for i, layer in enumerate(bottom + top):
            w = layer.weight.detach().to("cpu", torch.float32)
            if i == len(bottom):
                if w.shape[1] != len(perm):
                    raise ValueError(f"export_dlrm: the over arch reads {w.shape[1]} inputs, DLRM's dot interaction of "
                                     f"{n} features of dim {d} gives {len(perm)}")
                w = w[:, perm]
            params += [w.contiguous().reshape(-1).numpy(), layer.bias.detach().to("cpu", torch.float32).numpy()]
    step = engine.steps if version is None else int(version)
    return ebc.client._c.export_dlrm(str(root), step, "\n".join(lines), table_ids,
                                     [np.ascontiguousarray(p, dtype=np.float32) for p in params], int(samples),
                                     int(keep))
