"""The numpy client: tables by name, pulls and pushes of numpy arrays, blocking or with a handle.

Ids are 1-D ``int64`` (>= 0) or ``uint64`` arrays, in any order, duplicates allowed (a pull returns a row per id;
a push sums the gradient rows of a repeated id). Ids at or above 2^63 travel as ``uint64`` (or, in the torch
layers, as the ``int64`` view of them). Gradients are ``float32`` arrays of ``len(ids) x dim``. Rows come
back as ``float32`` arrays that own the decoded buffer (no copy after decoding). ``*_async`` calls return at once
with a handle whose ``wait()`` blocks with the GIL released; the arrays passed in may be reused right away.
"""

import hashlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from . import _pstrain

PushHandle = _pstrain.PushHandle


class PullHandle:
    """A pull in flight: ``wait(timeout=None)`` gives the rows (one array, or a list for ``pull_many``),
    ``done()`` tells without blocking."""

    __slots__ = ("_h", "_single")

    def __init__(self, handle, single: bool):
        self._h, self._single = handle, single

    def done(self) -> bool:
        return self._h.done()

    @property
    def seq(self) -> int:
        """The pull's sequence number on its lane (0 without one)."""
        return self._h.seq

    def take_state(self) -> np.ndarray:
        """A pull with state's optimizer state (every table's ``ids x state_len`` float32, flat), after ``wait``."""
        return self._h.take_state()

    def wait(self, timeout: Optional[float] = None, concat: bool = False):
        """The rows; with ``concat`` (``pull_many`` of tables of one dimension), one array of every table's rows
        one after another instead of a list."""
        rows = self._h.wait(timeout, concat)
        return rows[0] if self._single or concat else rows

OPTIMIZERS = ("sgd", "row_adagrad", "adam")
INITS = ("uniform", "normal")
ENCODINGS = ("f32", "f16", "bf16", "int8")


@dataclass(frozen=True)
class Table:
    """A registered table: its id on the servers, name, row dimension and wire encodings."""

    id: int
    name: str
    dim: int
    encoding: str = "f32"
    push_encoding: str = "f32"


def name_hash(name: str, salt: str) -> int:
    """A stable 64-bit hash of ``name`` (the same in every process and version): table ids and seeds by name."""
    return int.from_bytes(hashlib.blake2b(f"{salt}:{name}".encode(), digest_size=8).digest(), "little")


# Table ids picked by name fall in [FIRST_NAMED_ID, 2^31): above the ids the Rust trainer gives (0, 1, ...).
FIRST_NAMED_ID = 1 << 16


def table_id_of(name: str) -> int:
    """The id a table named ``name`` gets when the cluster does not hold it yet: a hash of the name, so every
    process of a job (several trainer ranks) picks the same id for it without talking to the others."""
    return FIRST_NAMED_ID + name_hash(name, "pstrain-table-id") % ((1 << 31) - FIRST_NAMED_ID)


def seed_of(name: str) -> int:
    """The default initializer seed of table ``name``: tables of different names start with different rows."""
    return name_hash(name, "pstrain-table-seed") >> 1


_EVICTION_KEYS = ("policy", "max_rows", "max_bytes", "decay_secs")


def _eviction_of(name: str, eviction: Optional[dict]):
    """``register_table``'s ``eviction`` dict as the extension takes it, unknown keys refused by name."""
    if eviction is None:
        return None
    if not isinstance(eviction, dict):
        raise ValueError(f"table {name!r}: eviction = {eviction!r}, expected a dict with keys {_EVICTION_KEYS}")
    unknown = sorted(set(eviction) - set(_EVICTION_KEYS))
    if unknown:
        raise ValueError(f"table {name!r}: eviction has unknown keys {unknown}, expected some of {_EVICTION_KEYS}")
    policy = eviction.get("policy")
    if policy not in ("lfu", "score"):
        raise ValueError(f"table {name!r}: eviction policy = {policy!r}, expected 'lfu' or 'score'")

    def count(key):
        v = eviction.get(key)
        if v is None:
            return None
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
            raise ValueError(f"table {name!r}: eviction {key} = {v!r}, expected an integer >= 0")
        return int(v)

    return (policy, count("max_rows"), count("max_bytes"), count("decay_secs"))


def _check_ids(ids, what: str, negative_as_bits: bool = False) -> np.ndarray:
    """``ids`` as a contiguous uint64 array (a view where possible), or a TypeError/ValueError naming the problem.
    With ``negative_as_bits``, a negative int64 is the bit pattern of an id at or above 2^63 (what
    ``uint64_tensor.view(torch.int64)`` gives); otherwise it is refused."""
    if not isinstance(ids, np.ndarray):
        raise TypeError(f"{what}: ids must be a numpy array of int64 or uint64, got {type(ids).__name__}")
    if ids.ndim != 1:
        raise ValueError(f"{what}: ids must be 1-D, got shape {ids.shape}")
    if ids.dtype == np.int64:
        if not negative_as_bits and ids.size and ids.min() < 0:
            i = int(np.argmax(ids < 0))
            raise ValueError(
                f"{what}: ids[{i}] = {int(ids[i])} is out of range: ids are unsigned 64-bit (>= 0; pass ids at or "
                "above 2^63 as uint64)")
        return np.ascontiguousarray(ids).view(np.uint64)
    if ids.dtype == np.uint64:
        return np.ascontiguousarray(ids)
    if ids.dtype == np.int32 and negative_as_bits:
        if ids.size and ids.min() < 0:
            i = int(np.argmax(ids < 0))
            raise ValueError(f"{what}: ids[{i}] = {int(ids[i])} is negative (int32 ids must be >= 0)")
        return ids.astype(np.uint64)
    raise TypeError(f"{what}: ids dtype {ids.dtype}: expected int64 or uint64")


def _check_grads(grads, n: int, dim: int, what: str, name: str = "grads") -> np.ndarray:
    """``grads`` as a contiguous ``float32`` ``[n, dim]`` array of finite values, or an error naming ``name``."""
    if not isinstance(grads, np.ndarray):
        raise TypeError(f"{what}: {name} must be a numpy float32 array, got {type(grads).__name__}")
    if grads.dtype != np.float32:
        raise TypeError(f"{what}: {name} dtype {grads.dtype}: expected float32")
    if grads.shape != (n, dim):
        raise ValueError(f"{what}: {name} shape {grads.shape}, expected ({n}, {dim}) for {n} ids of dim {dim}")
    finite = np.isfinite(grads)
    if not finite.all():
        r, c = np.argwhere(~finite)[0]
        raise ValueError(f"{what}: {name}[{r}, {c}] = {grads[r, c]}: values must be finite")
    return np.ascontiguousarray(grads)


class Client:
    """Connections to every server of a cluster.

    ``servers``: ``host:port`` addresses in shard order (a list, or one comma-separated string; a replicated
    shard's replicas joined by ``/``); ``tls_dir``: the
    cluster's TLS directory (``ca.pem``, ``client.pem``, ``client.key``); ``transport``: ``quic`` or ``tcp``;
    ``timeout_secs``: the most any call may take before it raises ``PsTimeoutError`` (a dead server's error
    names it and the time really waited).

    ``close()`` (or leaving a ``with`` block) waits for the requests in flight to be answered or to fail, then
    closes the connections; a push is never sent twice. A closed client refuses requests with ``PsError``.
    A client is a connection, not a value: it cannot be pickled or deep-copied.
    """

    def __init__(
        self,
        servers: Union[str, Sequence[str]],
        tls_dir: str,
        *,
        transport: str = "quic",
        timeout_secs: float = 30.0,
        server_name: Optional[str] = None,
    ):
        if isinstance(servers, str):
            servers = [s.strip() for s in servers.split(",") if s.strip()]
        self._servers, self._tls_dir = list(servers), str(tls_dir)
        self._c = _pstrain.Client(self._servers, self._tls_dir, transport, float(timeout_secs), server_name)
        self._tables: Dict[str, Table] = {}
        self._known = {t["name"]: t for t in self._c.known_tables()}

    @property
    def num_servers(self) -> int:
        return self._c.num_servers

    def register_table(
        self,
        name: str,
        dim: int,
        *,
        optimizer: str = "sgd",
        lr: float = 0.01,
        eps: float = 1e-8,
        initial_accumulator: float = 0.0,
        betas=(0.9, 0.999),
        weight_decay: float = 0.0,
        clip_norm: float = 0.0,
        init: str = "uniform",
        init_scale: float = 0.01,
        seed: Optional[int] = None,
        encoding: str = "f32",
        push_encoding: Optional[str] = None,
        table_id: Optional[int] = None,
        precision: str = "f32",
        eviction: Optional[dict] = None,
        state_precision: str = "f32",
    ) -> Table:
        """Creates table ``name`` on every server (rows are created on first use from the initializer), or
        attaches to it if the cluster has it with the same settings. Returns the :class:`Table`.

        ``optimizer`` runs on the servers: ``sgd`` (``lr``), ``row_adagrad`` (``lr``, ``eps``,
        ``initial_accumulator``) or ``adam`` (``lr``, ``betas``, ``eps``); ``weight_decay`` and ``clip_norm``
        apply to each. ``init``: ``uniform`` in ``[-init_scale, init_scale]`` or ``normal`` with std
        ``init_scale``, deterministic in (``seed``, id); the default seed is a hash of the name, so tables of
        different names start with different rows. ``encoding``/``push_encoding``: how rows and gradients
        travel (``f32``, ``f16``, ``bf16``, ``int8``). ``table_id``: the id on the servers; by default the
        cluster's id for ``name`` if it holds the table, else a hash of the name (so several processes agree on
        it without talking to each other). ``precision``: how the servers store the weights, ``f32``, ``bf16``
        or ``f16`` (half the bytes per weight; the optimizer state stays f32, updates are rounded
        stochastically; half precision needs an optimizer with state, not ``sgd``). ``state_precision``: how they
        store the optimizer's moments, ``f32`` or ``bf16`` (``adam`` only, also rounded stochastically: with
        ``precision="bf16"`` an Adam row takes about half the bytes of an f32 one). ``eviction``: a row cap per
        server, ``{"policy": "lfu" | "score", "max_rows": N, "max_bytes": B, "decay_secs": S}`` (``max_rows`` or
        ``max_bytes`` required): past it, each expiry pass deletes the least frequently updated rows (``lfu``) or
        the lowest scored (``score``: scores given by :meth:`score`), from memory and RocksDB.

        Example::

            items = client.register_table("items", 32, optimizer="row_adagrad", lr=0.05,
                                          eviction={"policy": "score", "max_rows": 1_000_000, "decay_secs": 3600})
            client.score(items, ids_clicked, np.ones(len(ids_clicked), np.float32))
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"table name {name!r}: expected a non-empty string")
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"table {name!r}: dim = {dim!r}, expected an integer >= 1")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"table {name!r}: optimizer = {optimizer!r}, expected one of {OPTIMIZERS}")
        if init not in INITS:
            raise ValueError(f"table {name!r}: init = {init!r}, expected one of {INITS}")
        push_encoding = push_encoding or encoding
        for k, v in (("encoding", encoding), ("push_encoding", push_encoding)):
            if v not in ENCODINGS:
                raise ValueError(f"table {name!r}: {k} = {v!r}, expected one of {ENCODINGS}")
        known = self._known.get(name)
        if known is not None and known["dim"] != dim:
            raise ValueError(f"table {name!r}: dim = {dim}, but the cluster holds it with dim {known['dim']}")
        if seed is None:
            # A table the cluster holds keeps its seed (e.g. one the Rust trainer registered); a new one gets a
            # seed from its name.
            seed = known["seed"] if known is not None and "seed" in known else seed_of(name)
        if table_id is None:
            if known is not None:
                table_id = known["id"]
            elif name in self._tables:
                table_id = self._tables[name].id
            else:
                table_id = table_id_of(name)
                clash = [t["name"] for t in self._known.values() if t["id"] == table_id]
                clash += [t.name for t in self._tables.values() if t.id == table_id]
                if clash:
                    raise ValueError(
                        f"table {name!r}: its id by name ({table_id}) is taken by table {clash[0]!r}: pass table_id")
        self._c.register_table(
            int(table_id), name, int(dim), optimizer, float(lr), float(eps), float(initial_accumulator),
            float(betas[0]), float(betas[1]), float(weight_decay), float(clip_norm), init, float(init_scale),
            int(seed), precision, _eviction_of(name, eviction), state_precision,
        )
        t = Table(int(table_id), name, int(dim), encoding, push_encoding)
        self._tables[name] = t
        return t

    def table(self, table: Union[str, Table]) -> Table:
        """The registered table ``table`` (a name or a :class:`Table`); ``KeyError`` naming it if unknown."""
        if isinstance(table, Table):
            return table
        t = self._tables.get(table)
        if t is None:
            known = sorted(self._tables)
            raise KeyError(f"unknown table {table!r}: registered tables are {known}")
        return t

    @property
    def tables(self) -> List[Table]:
        return list(self._tables.values())

    def pull_async(self, table, ids) -> PullHandle:
        """Starts a pull of ``ids``' rows; ``wait()`` gives them."""
        t = self.table(table)
        u = _check_ids(ids, f"pull of table {t.name!r}")
        return PullHandle(self._c.pull_async([(t.id, t.dim)], f"table {t.name!r}", t.encoding, [u]), True)

    def pull_many(self, tables, ids, *, lane=None, with_state: bool = False) -> PullHandle:
        """Starts one pull of several tables (``ids[i]`` for ``tables[i]``, all of one encoding): one request per
        server for all of them. ``wait()`` gives the list of row arrays. ``lane`` (a ``pstrain._pstrain.Lane``)
        orders it after that lane's earlier pushes; ``with_state`` pulls the rows' optimizer state too (ids must
        be distinct; ``handle.take_state()`` after ``wait``)."""
        ts = [self.table(t) for t in tables]
        if len(ts) != len(ids):
            raise ValueError(f"pull_many: {len(ids)} id arrays for {len(ts)} tables")
        encodings = {t.encoding for t in ts}
        if len(encodings) > 1:
            raise ValueError(f"pull_many: tables of several encodings {sorted(encodings)}: pull each group apart")
        us = [_check_ids(i, f"pull of table {t.name!r}") for t, i in zip(ts, ids)]
        what = "tables " + ", ".join(repr(t.name) for t in ts) if len(ts) < 5 else f"{len(ts)} tables"
        h = self._c.pull_async([(t.id, t.dim) for t in ts], what, ts[0].encoding if ts else "f32", us, lane,
                               with_state)
        return PullHandle(h, False)

    def pull(self, table, ids) -> np.ndarray:
        """The rows of ``ids``: ``float32`` ``[len(ids), dim]``."""
        return self.pull_async(table, ids).wait()

    def push_async(self, table, ids, grads, *, lr_scale: float = 1.0) -> PushHandle:
        """Starts a push of ``grads`` for ``ids``; ``wait()`` gives the rows applied. ``lr_scale`` multiplies the
        table's learning rate for this push (a schedule; finite, >= 0; an ``ftrl`` table takes only 1)."""
        t = self.table(table)
        what = f"push of table {t.name!r}"
        u = _check_ids(ids, what)
        g = _check_grads(grads, len(u), t.dim, what)
        return self._c.push_async([(t.id, t.dim)], f"table {t.name!r}", t.push_encoding, [u], [g],
                                  lr_scale=float(lr_scale))

    def push_many(self, tables, ids, grads, *, lane=None, lr_scale: float = 1.0) -> PushHandle:
        """Starts one push of several tables (``grads[i]`` for ``ids[i]`` of ``tables[i]``, one push encoding);
        ``lane`` orders it after that lane's earlier pulls; ``lr_scale`` as for ``push_async``."""
        ts = [self.table(t) for t in tables]
        if not (len(ts) == len(ids) == len(grads)):
            raise ValueError(f"push_many: {len(ids)} id and {len(grads)} gradient arrays for {len(ts)} tables")
        encodings = {t.push_encoding for t in ts}
        if len(encodings) > 1:
            raise ValueError(f"push_many: tables of several push encodings {sorted(encodings)}")
        us, gs = [], []
        for t, i, g in zip(ts, ids, grads):
            what = f"push of table {t.name!r}"
            u = _check_ids(i, what)
            us.append(u)
            gs.append(_check_grads(g, len(u), t.dim, what))
        what = "tables " + ", ".join(repr(t.name) for t in ts) if len(ts) < 5 else f"{len(ts)} tables"
        return self._c.push_async([(t.id, t.dim) for t in ts], what, ts[0].push_encoding if ts else "f32", us, gs,
                                  lane, lr_scale=float(lr_scale))

    def push(self, table, ids, grads, *, lr_scale: float = 1.0) -> int:
        """Applies ``grads`` (``float32`` ``[len(ids), dim]``) with the table's optimizer, at ``lr_scale`` times its
        learning rate; returns rows applied."""
        return self.push_async(table, ids, grads, lr_scale=lr_scale).wait()

    def write(self, table, ids, rows) -> int:
        """Sets the weights of ``ids``' rows to ``rows`` (``float32`` ``[len(ids), dim]``, finite; a repeated id
        takes its last row), keeping their optimizer state (rows not yet created get the initial state): how
        saved weights are loaded. Not atomic with a concurrent push of the same rows. Returns rows written."""
        t = self.table(table)
        what = f"write of table {t.name!r}"
        u = _check_ids(ids, what)
        r = _check_grads(rows, len(u), t.dim, what, "rows")
        return self._c.write_rows([(t.id, t.dim)], what, [u], [r])

    def score(self, table, ids, scores, *, mode: str = "add") -> int:
        """Gives ``ids`` of a table that evicts by score (``eviction={"policy": "score", ...}``) their
        ``scores`` (one each, finite, ``>= 0``: an engagement, a value of your own), added to the rows' scores
        (``mode="add"``; a repeated id adds each) or replacing them (``mode="set"``; a repeated id takes its
        last). Scores halve every ``decay_secs``; past the cap each expiry pass deletes the lowest scored rows. Only
        ids that have a row are scored (push them first); returns how many distinct ids were. Scores live in the
        servers' memory only: a restarted or promoted server starts every row at 0."""
        return self.score_many([table], [ids], [scores], mode=mode)

    def score_many(self, tables, ids, scores, *, mode: str = "add") -> int:
        """:meth:`score` of several tables at once (``scores[i]`` for ``ids[i]`` of ``tables[i]``): one request
        per server for all of them. Returns how many distinct ids had a row."""
        ts = [self.table(t) for t in tables]
        what = ("score of tables " + ", ".join(repr(t.name) for t in ts)) if len(ts) < 5 else f"score of {len(ts)} tables"
        if not (len(ts) == len(ids) == len(scores)):
            raise ValueError(f"{what}: {len(ids)} id and {len(scores)} score arrays for {len(ts)} tables")
        if mode not in ("add", "set"):
            raise ValueError(f"{what}: mode = {mode!r}, expected 'add' or 'set'")
        us, ss = [], []
        for t, i, sc in zip(ts, ids, scores):
            u = _check_ids(i, what)
            s = np.ascontiguousarray(np.asarray(sc, dtype=np.float32).reshape(-1))
            if len(s) != len(u):
                raise ValueError(f"{what}: table {t.name!r}: {len(s)} scores for {len(u)} ids")
            us.append(u)
            ss.append(s)
        return self._c.score([t.id for t in ts], what, us, ss, mode == "set")

    def flush(self) -> int:
        """Writes every server's dirty rows to RocksDB; returns the rows written."""
        return self._c.flush()

    def checkpoint(self, directory: str, step: int = 0):
        """A consistent snapshot of every server's tables under ``directory`` (on the servers' file system): a name
        relative to the servers' checkpoint root (``ps-server --checkpoint-root``; ``LocalCluster``'s
        ``checkpoint_root``), or an absolute path inside it; anywhere else is refused (``ValueError``)."""
        return self._c.checkpoint(str(directory), int(step))

    def stats(self) -> dict:
        """Calls, rows and seconds of pulls and pushes (on the I/O threads), and seconds the caller spent blocked
        in ``wait``."""
        return self._c.stats()

    @property
    def in_flight(self) -> int:
        """Requests started and not yet answered."""
        return self._c.in_flight

    def close(self):
        """Waits for the requests in flight (each bounded by ``timeout_secs``), then closes every connection."""
        self._c.close()

    def __reduce__(self):
        raise TypeError(
            "a pstrain.Client is a set of connections and cannot be pickled or copied: save the tables with "
            "state_dict() or Client.checkpoint(), and make a new Client in the new process")

    def __deepcopy__(self, memo):
        self.__reduce__()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
