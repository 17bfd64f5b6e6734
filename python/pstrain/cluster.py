"""A local cluster of real ``ps-server`` processes on loopback, for examples and tests."""

import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import List, Optional, Sequence

from . import _pstrain


def find_binary(name: str) -> str:
    """The path of one of the project's binaries (``ps-server``, ``gen-criteo``, ``trainer``).

    Looked up in order: the environment variable ``PSTRAIN_<NAME>`` (e.g. ``PSTRAIN_PS_SERVER``),
    ``$PSTRAIN_BIN_DIR/<name>``, ``PATH``, ``$CARGO_TARGET_DIR/release``, and the ``target/release`` of the
    checkout this package was installed from."""
    var = "PSTRAIN_" + name.upper().replace("-", "_")
    tried = []
    if os.environ.get(var):
        p = os.environ[var]
        if os.path.isfile(p):
            return p
        raise FileNotFoundError(f"{var}={p} is not a file")
    candidates = []
    if os.environ.get("PSTRAIN_BIN_DIR"):
        p = Path(os.environ["PSTRAIN_BIN_DIR"]) / name
        if p.is_file():
            return str(p)
        tried.append(str(p))
    on_path = shutil.which(name)
    if on_path:
        return on_path
    tried.append("PATH")
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "release" / name)
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "Cargo.toml").is_file() and (parent / "ps-server").is_dir():
            candidates.append(parent / "target" / "release" / name)
            break
    for c in candidates:
        if c.is_file():
            return str(c)
        tried.append(str(c))
    raise FileNotFoundError(
        f"{name} not found (tried {var}, {', '.join(tried)}): build it with "
        f"`cargo build --release --workspace --bins` and set PSTRAIN_BIN_DIR to the directory"
    )


class LocalCluster:
    """``servers`` ``ps-server`` processes on loopback, each with its own RocksDB directory under ``run_dir`` (a
    temporary directory, removed at ``stop()``, if not given) and a dev CA in ``run_dir/tls``. ``extra_args`` go
    to every server (e.g. ``["--memory-budget-rows", "100000"]``). Use as a context manager, or call ``stop()``."""

    def __init__(self, servers: int = 2, run_dir: Optional[str] = None, extra_args: Sequence[str] = (),
                 ps_server: Optional[str] = None):
        self._tmp = None
        if run_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="pstrain-cluster-")
            run_dir = self._tmp
        self._c = _pstrain.LocalCluster(ps_server or find_binary("ps-server"), int(servers), str(run_dir),
                                        [str(a) for a in extra_args])

    @property
    def servers(self) -> List[str]:
        """QUIC addresses in shard order (what :class:`pstrain.Client` takes)."""
        return self._c.servers

    @property
    def metrics(self) -> List[str]:
        return self._c.metrics

    @property
    def tls_dir(self) -> str:
        return self._c.tls_dir

    @property
    def run_dir(self) -> str:
        return self._c.run_dir

    @property
    def pids(self) -> List[int]:
        return self._c.pids

    def kill(self, index: int):
        """SIGKILLs server ``index`` (for fault tests)."""
        os.kill(self.pids[index], signal.SIGKILL)

    def stop(self, timeout_secs: float = 60.0):
        """SIGTERM to every server; raises unless each exits cleanly. Idempotent."""
        try:
            if self._c.running:
                self._c.stop(timeout_secs)
        finally:
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
