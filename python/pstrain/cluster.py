"""A local cluster of real ``ps-server`` processes on loopback, for examples and tests.

The servers die with the Python process that started them, however it ends (SIGKILL and SIGTERM included): a
small watchdog process holds a pipe from the parent, and when the pipe closes without a clean ``stop()`` it
kills the servers and removes the cluster's temporary directory."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import List, Optional, Sequence

from . import _pstrain
from .errors import ClusterError

# The watchdog: reads its standard input (the parent's pipe) to the end. "stop" before the end means the parent
# stopped the cluster itself; otherwise the parent died, and the watchdog kills the servers (each only if it
# still runs the ps-server it was given) and removes the temporary directory.
_WATCHDOG = r"""
import os, shutil, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
tmp, pids = sys.argv[1], [int(p) for p in sys.argv[2:]]
said = sys.stdin.read()
if said.strip() == "stop":
    sys.exit(0)
for pid in pids:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"ps-server" not in f.read():
                continue
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass
for pid in pids:
    try:
        while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
            os.sched_yield()
    except OSError:
        pass
if tmp:
    shutil.rmtree(tmp, ignore_errors=True)
"""


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
    to every server (e.g. ``["--memory-budget-rows", "100000"]``). ``restore_from``: a snapshot directory written
    by ``Client.checkpoint`` / ``collection.checkpoint`` (taken on any number of servers): each server starts
    from its share of it (``ps-server restore``). ``checkpoint_root``: the only directory the servers write
    checkpoints under (``ps-server --checkpoint-root``; a checkpoint elsewhere is refused, docs/security.md);
    default the current working directory, so ``collection.checkpoint("snap")`` writes ``./snap``, which outlives
    the cluster and ``restore_from="snap"`` reads. Use as a context manager, or call ``stop()``; the servers die
    with this process in any case."""

    def __init__(self, servers: int = 2, run_dir: Optional[str] = None, extra_args: Sequence[str] = (),
                 ps_server: Optional[str] = None, restore_from: Optional[str] = None,
                 checkpoint_root: Optional[str] = None):
        self._tmp = None
        extra_args = [str(a) for a in extra_args]
        if not any(a == "--checkpoint-root" or a.startswith("--checkpoint-root=") for a in extra_args):
            root = os.path.abspath(checkpoint_root if checkpoint_root is not None else os.getcwd())
            extra_args += ["--checkpoint-root", root]
        elif checkpoint_root is not None:
            raise ValueError("checkpoint_root given twice: as an argument and as --checkpoint-root in extra_args")
        self._watchdog = None
        servers = int(servers)
        if run_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="pstrain-cluster-")
            run_dir = self._tmp
        binary = ps_server or find_binary("ps-server")
        try:
            if restore_from is not None:
                _restore(binary, str(restore_from), servers, str(run_dir))
            self._c = _pstrain.LocalCluster(binary, servers, str(run_dir), extra_args)
        except RuntimeError as e:
            self._remove_tmp()
            raise ClusterError(str(e)) from None
        except BaseException:
            self._remove_tmp()
            raise
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, self._tmp or "", *[str(p) for p in self._c.pids]],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            close_fds=True)

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
        """SIGTERM to every server; raises ``ClusterError`` (a ``PsError``) naming each server that did not exit
        cleanly. Idempotent."""
        try:
            if self._c.running:
                try:
                    self._c.stop(timeout_secs)
                except RuntimeError as e:
                    raise ClusterError(f"{e} (logs under {self.run_dir})") from None
        finally:
            self._remove_tmp()
            if self._watchdog is not None:
                try:
                    self._watchdog.communicate(b"stop\n", timeout=30)
                except (OSError, ValueError, subprocess.TimeoutExpired):
                    self._watchdog.kill()
                self._watchdog = None

    def _remove_tmp(self):
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.stop()
            return
        # An error is already on its way out: a server that died with it (often its cause) must not replace it.
        try:
            self.stop()
        except ClusterError as e:
            warnings.warn(f"while handling {exc_type.__name__}: {e}", RuntimeWarning, stacklevel=2)


def _restore(binary: str, snapshot: str, servers: int, run_dir: str):
    """Builds each server's data directory (``run_dir/ps-<i>``, as the cluster names them) from ``snapshot``."""
    if not os.path.isdir(snapshot):
        raise ClusterError(f"restore_from = {snapshot}: not a directory")
    for i in range(servers):
        out = subprocess.run(
            [binary, "restore", "--from", snapshot, "--num-shards", str(servers), "--shard-index", str(i),
             "--data-dir", os.path.join(run_dir, f"ps-{i}")], capture_output=True, text=True)
        if out.returncode != 0:
            raise ClusterError(f"ps-server restore --from {snapshot} (shard {i} of {servers}) failed: "
                               f"{out.stderr.strip() or out.stdout.strip()}")
