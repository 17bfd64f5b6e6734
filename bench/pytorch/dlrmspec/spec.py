"""Model specs (docs/model-spec.md): parsing with tomllib and every check the contract lists.

A bad spec raises SpecError whose message names the field, e.g. `feature[3] (C4).dim: must be at least 1`.

Defaults for fields the contract leaves open follow today's trainer flags (trainer/src/config.rs): [sparse] dim 16,
pooling sum, tokens 1, hash_size 0, optimizer adagrad, lr 0.05 for adagrad / 0.5 for sgd, encoding f16;
[interaction] kind dot; dense_inputs 13; name the file's stem. Without [dense] the dense optimizer comes from the
command line flags (dlrm_reference.py --dense-optimizer/--lr), whose default follows the [sparse] optimizer as
--optimizer does today (adam for adagrad, sgd for sgd).
"""

import math
import os
import tomllib
from dataclasses import dataclass, field

NUM_DENSE = 13
NUM_SPARSE = 26
ENCODINGS = ("f32", "f16", "bf16", "int8")
SPARSE_OPTIMIZERS = ("sgd", "adagrad")
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")
POOLINGS = ("sum", "mean")
EMB_LR_DEFAULT = {"adagrad": 0.05, "sgd": 0.5}

TOP_FIELDS = ("name", "dense_inputs", "bottom_mlp", "top_mlp", "interaction", "dense", "sparse", "feature")
INTERACTION_FIELDS = ("kind", "layers", "rank")
DENSE_FIELDS = ("optimizer", "lr")
SPARSE_FIELDS = ("dim", "pooling", "tokens", "hash_size", "optimizer", "lr", "encoding")
FEATURE_FIELDS = ("column", "table") + SPARSE_FIELDS
# Settings of a table (features sharing a table must agree on them); pooling and tokens are per feature.
TABLE_SETTINGS = ("dim", "optimizer", "lr", "hash_size", "encoding")


class SpecError(ValueError):
    """A refused spec; the message names the file and the field."""


@dataclass
class Feature:
    index: int  # position in the spec's [[feature]] list
    column: int  # 0-based: C1 is 0
    table: str
    dim: int
    pooling: str
    tokens: int
    hash_size: int
    optimizer: str
    lr: float
    encoding: str

    @property
    def name(self):
        return f"C{self.column + 1}"


@dataclass
class Table:
    name: str
    index: int  # order of first appearance (the T of feature_id(T, token))
    dim: int
    optimizer: str
    lr: float
    hash_size: int
    encoding: str
    features: list = field(default_factory=list)  # feature indices


@dataclass
class Spec:
    name: str
    dense_inputs: int
    bottom_mlp: list
    top_mlp: list
    interaction: str  # dot | dcn
    dcn_layers: int
    dcn_rank: int
    dense_optimizer: object  # str or None (then the flags decide)
    dense_lr: object  # float or None
    sparse_optimizer: str  # the [sparse] section's optimizer (picks the dense default, as --optimizer does)
    features: list
    tables: list

    @property
    def interaction_width(self):
        d = self.bottom_mlp[-1]
        if self.interaction == "dot":
            n = len(self.features) + 1
            return d + n * (n - 1) // 2
        return d + sum(f.dim for f in self.features)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v):
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


class _Checker:
    def __init__(self, path):
        self.path = path

    def fail(self, where, problem):
        raise SpecError(f"{self.path}: {where}: {problem}")

    def known(self, where, table, allowed):
        for k in table:
            if k not in allowed:
                at = f"{where}.{k}" if where else k
                self.fail(at, f"unknown field (expected one of: {', '.join(allowed)})")

    def section(self, doc, key):
        v = doc.get(key, {})
        if not isinstance(v, dict):
            self.fail(key, "must be a table ([" + key + "])")
        return v

    def int_at_least(self, where, v, low):
        if not _is_int(v):
            self.fail(where, f"must be an integer, got {v!r}")
        if v < low:
            self.fail(where, f"must be at least {low}")
        return v

    def sizes(self, where, v):
        if not isinstance(v, list) or not v:
            self.fail(where, "must be a non-empty array of layer sizes")
        for i, s in enumerate(v):
            self.int_at_least(f"{where}[{i}]", s, 1)
        return list(v)

    def choice(self, where, v, options):
        if v not in options:
            self.fail(where, f"{v!r} is not one of: {' | '.join(options)}")
        return v

    def lr(self, where, v):
        if not _is_num(v) or v <= 0:
            self.fail(where, f"must be a positive number, got {v!r}")
        return float(v)

    def encoding(self, where, v):
        if not isinstance(v, str):
            self.fail(where, f"must be a string like \"f16\" or \"f16/int8\", got {v!r}")
        parts = v.split("/")
        if len(parts) > 2 or any(p not in ENCODINGS for p in parts):
            self.fail(where, f"{v!r} is not ENC or PULL/PUSH with each one of: {' | '.join(ENCODINGS)}")
        return v


def resolve_spec_path(name_or_path, repo_root=None):
    """A file path as given, or a shipped spec's NAME (model/specs/NAME.toml), as `trainer --model-spec` takes."""
    if os.path.exists(name_or_path):
        return name_or_path
    if os.sep not in name_or_path and not name_or_path.endswith(".toml"):
        root = repo_root or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
        shipped = os.path.normpath(os.path.join(root, "model", "specs", name_or_path + ".toml"))
        if os.path.exists(shipped):
            return shipped
    raise SpecError(f"{name_or_path}: no such spec file (nor a shipped spec model/specs/{name_or_path}.toml)")


def load_spec(path):
    """Reads and checks the spec at `path` (a file, or a shipped spec's name)."""
    path = resolve_spec_path(path)
    with open(path, "rb") as f:
        try:
            doc = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise SpecError(f"{path}: not valid TOML: {e}") from None
    return parse_spec(doc, path, default_name=os.path.splitext(os.path.basename(path))[0])


def loads_spec(text, path="<spec>", default_name="spec"):
    """Parses a spec from a string (tests)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML: {e}") from None
    return parse_spec(doc, path, default_name)


def parse_spec(doc, path="<spec>", default_name="spec"):
    c = _Checker(path)
    c.known("", doc, TOP_FIELDS)

    name = doc.get("name", default_name)
    if not isinstance(name, str) or not name:
        c.fail("name", f"must be a non-empty string, got {name!r}")
    dense_inputs = doc.get("dense_inputs", NUM_DENSE)
    c.int_at_least("dense_inputs", dense_inputs, 1)
    if dense_inputs != NUM_DENSE:
        c.fail("dense_inputs", f"must be {NUM_DENSE} (Criteo's I1..I13), got {dense_inputs}")
    if "bottom_mlp" not in doc:
        c.fail("bottom_mlp", "missing")
    if "top_mlp" not in doc:
        c.fail("top_mlp", "missing")
    bottom = c.sizes("bottom_mlp", doc["bottom_mlp"])
    top = c.sizes("top_mlp", doc["top_mlp"])
    if top[-1] != 1:
        c.fail(f"top_mlp[{len(top) - 1}]", f"the last size must be 1 (the logit), got {top[-1]}")

    inter = c.section(doc, "interaction")
    c.known("interaction", inter, INTERACTION_FIELDS)
    kind = c.choice("interaction.kind", inter.get("kind", "dot"), ("dot", "dcn"))
    layers = rank = 0
    if kind == "dcn":
        for k in ("layers", "rank"):
            if k not in inter:
                c.fail(f"interaction.{k}", "missing (kind = \"dcn\" needs layers >= 1 and rank >= 1)")
        layers = c.int_at_least("interaction.layers", inter["layers"], 1)
        rank = c.int_at_least("interaction.rank", inter["rank"], 1)
    else:
        for k in ("layers", "rank"):
            if k in inter:
                c.fail(f"interaction.{k}", "only for kind = \"dcn\"")

    dense = c.section(doc, "dense")
    c.known("dense", dense, DENSE_FIELDS)
    dense_opt = dense.get("optimizer")
    if dense_opt is not None:
        c.choice("dense.optimizer", dense_opt, DENSE_OPTIMIZERS)
    dense_lr = c.lr("dense.lr", dense["lr"]) if "lr" in dense else None

    sparse = c.section(doc, "sparse")
    c.known("sparse", sparse, SPARSE_FIELDS)
    sparse_opt = c.choice("sparse.optimizer", sparse.get("optimizer", "adagrad"), SPARSE_OPTIMIZERS)

    feats_doc = doc.get("feature", [])
    if not isinstance(feats_doc, list) or not all(isinstance(f, dict) for f in feats_doc):
        c.fail("feature", "must be an array of tables ([[feature]])")
    if not feats_doc:
        c.fail("feature", "no [[feature]] entries (at least one sparse feature is needed)")

    features, tables, by_column = [], {}, {}
    for i, fd in enumerate(feats_doc):
        col_text = fd.get("column")
        if col_text is None:
            c.fail(f"feature[{i}].column", "missing (C1..C26)")
        if not isinstance(col_text, str) or not col_text.startswith("C") or not col_text[1:].isdigit() \
                or not 1 <= int(col_text[1:]) <= NUM_SPARSE:
            c.fail(f"feature[{i}].column", f"{col_text!r} is not a Criteo column C1..C{NUM_SPARSE}")
        col = int(col_text[1:]) - 1
        at = f"feature[{i}] ({col_text})"
        c.known(at, fd, FEATURE_FIELDS)
        if col in by_column:
            c.fail(f"{at}.column", f"{col_text} is already read by feature[{by_column[col]}]")
        by_column[col] = i
        if "table" not in fd:
            c.fail(f"{at}.table", "missing (every feature names its embedding table)")
        table = fd["table"]
        if not isinstance(table, str) or not table:
            c.fail(f"{at}.table", f"must be a non-empty string, got {table!r}")

        def get(k, default):
            if k in fd:
                return fd[k], f"{at}.{k}"
            return sparse.get(k, default), f"sparse.{k}"

        v, w = get("dim", 16)
        dim = c.int_at_least(w, v, 1)
        v, w = get("pooling", "sum")
        pooling = c.choice(w, v, POOLINGS)
        v, w = get("tokens", 1)
        tokens = c.int_at_least(w, v, 1)
        v, w = get("hash_size", 0)
        hash_size = c.int_at_least(w, v, 0)
        v, w = get("optimizer", "adagrad")
        opt = c.choice(w, v, SPARSE_OPTIMIZERS)
        if "lr" in fd or "lr" in sparse:
            v, w = get("lr", None)
            lr = c.lr(w, v)
        else:
            lr = EMB_LR_DEFAULT[opt]
        v, w = get("encoding", "f16")
        enc = c.encoding(w, v)
        f = Feature(i, col, table, dim, pooling, tokens, hash_size, opt, lr, enc)
        t = tables.get(table)
        if t is None:
            tables[table] = Table(table, len(tables), dim, opt, lr, hash_size, enc, [i])
        else:
            for k in TABLE_SETTINGS:
                mine, theirs = getattr(f, k), getattr(t, k)
                if mine != theirs:
                    first = features[t.features[0]]
                    c.fail(f"{at}.{k}", f"{mine!r} differs from {theirs!r} of feature[{first.index}] ({first.name}), "
                                        f"which shares table {table!r} (features sharing a table share its {k})")
            t.features.append(i)
        features.append(f)

    if kind == "dot":
        d = bottom[-1]
        for f in features:
            if f.dim != d:
                c.fail(f"feature[{f.index}] ({f.name}).dim",
                       f"{f.dim} does not fit interaction.kind = \"dot\": every feature's dim must equal the bottom "
                       f"MLP's last size ({d}); use kind = \"dcn\" for mixed dims")

    return Spec(name, dense_inputs, bottom, top, kind, layers, rank, dense_opt, dense_lr, sparse_opt, features,
                list(tables.values()))
