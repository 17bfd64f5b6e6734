"""Regression tests of issue 42's list (what a new PyTorch user ran into), one per item, against real servers."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import pstrain
from pstrain.torch import EmbeddingCollection, EmbeddingTable, JaggedFeatures


def test_issue_42_close_waits_for_a_push_in_flight_and_never_sends_it_twice(cluster, table_name):
    """close() right after push_async: the push is applied exactly once, close() returns once it is answered,
    and the closed client refuses further requests. Repeated: the double application was intermittent."""
    reader = pstrain.Client(cluster.servers, cluster.tls_dir)
    for trial in range(6):
        name = f"{table_name}_{trial}"
        c = pstrain.Client(cluster.servers, cluster.tls_dir)
        c.register_table(name, dim=8, optimizer="sgd", lr=1.0, init_scale=0.0)
        ids = np.arange(100_000, dtype=np.int64)
        c.push_async(name, ids, np.ones((len(ids), 8), np.float32))
        c.close()
        assert c.in_flight == 0
        reader.register_table(name, dim=8, optimizer="sgd", lr=1.0, init_scale=0.0)
        rows = reader.pull(name, ids)
        np.testing.assert_array_equal(rows, -np.ones_like(rows))
        with pytest.raises(pstrain.PsError, match="closed"):
            c.pull(name, ids[:3])
        c.close()  # idempotent
    reader.close()


def test_issue_42_a_dead_server_is_named_with_the_real_wait():
    cluster = pstrain.LocalCluster(servers=2)
    try:
        client = pstrain.Client(cluster.servers, cluster.tls_dir, timeout_secs=3)
        client.register_table("k", dim=4)
        ids = np.arange(1000, dtype=np.int64)
        client.pull("k", ids)
        dead = cluster.servers[1]
        cluster.kill(1)
        with pytest.raises((pstrain.PsConnectionError, pstrain.PsTimeoutError)) as e:
            client.pull("k", ids)
        msg = str(e.value)
        assert dead in msg, msg
        assert re.search(r"(gave up after|timeout of) \d+\.\d s", msg), msg
        client.close()
    finally:
        with pytest.raises(pstrain.ClusterError, match="ps-1"):
            cluster.stop(timeout_secs=10)


def test_issue_42_cluster_exit_keeps_the_error_that_ended_the_block():
    """A server killed inside ``with LocalCluster``: the request's PsError comes out of the block (the unclean
    exit of the server is a warning), and ``except pstrain.PsError`` catches it."""
    caught = None
    with pytest.warns(RuntimeWarning, match="ps-0"):
        try:
            with pstrain.LocalCluster(servers=1) as c:
                client = pstrain.Client(c.servers, c.tls_dir, timeout_secs=2)
                client.register_table("k", dim=2)
                c.kill(0)
                client.pull("k", np.arange(10, dtype=np.int64))
        except pstrain.PsError as e:
            caught = e
    assert isinstance(caught, (pstrain.PsConnectionError, pstrain.PsTimeoutError)), caught


def _wait_gone(pids, path, seconds=60):
    """Polls until no pid runs (or is only a zombie) and ``path`` is gone; False at the deadline."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = []
        for p in pids:
            try:
                if Path(f"/proc/{p}/stat").read_text().split()[2] != "Z":
                    alive.append(p)
            except OSError:
                pass
        if not alive and not os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_issue_42_servers_die_with_the_python_process(sig):
    code = ("import sys, pstrain\nc = pstrain.LocalCluster(servers=2)\nprint(c.run_dir, *c.pids, flush=True)\n"
            "sys.stdin.read()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        run_dir, *pids = p.stdout.readline().split()
        pids = [int(x) for x in pids]
        assert len(pids) == 2 and os.path.isdir(run_dir)
        p.send_signal(sig)
        p.wait(timeout=60)
        assert _wait_gone(pids, run_dir), f"servers {pids} or {run_dir} outlived their parent"
    finally:
        if p.poll() is None:
            p.kill()


def test_issue_42_read_criteo_multi_hot_and_bad_lines(tmp_path):
    dense = "\t".join(["1"] * 13)
    cats = lambda first: "\t".join([first, "bb"] + ["cc"] * 24)
    lines = [f"1\t{dense}\t{cats('a1|a2|a3')}", "x\tnot a line", f"0\t{dense}\t{cats('')}",
             f"1\t{dense}\t{cats('a2')}"]
    path = tmp_path / "m.tsv"
    path.write_text("\n".join(lines) + "\n")
    layout = [dict(column="C1", tokens=4), dict(column="C2")]
    with pytest.warns(pstrain.CriteoWarning, match=r"skipped 1 bad lines of 4 \(first: .*m.tsv:2"):
        y, d, feats, stats = pstrain.read_criteo(str(path), layout=layout, return_stats=True)
    np.testing.assert_array_equal(y, [1, 0, 1])
    values, lengths = feats["C1"]
    np.testing.assert_array_equal(lengths, [3, 0, 1])
    assert values[1] == values[3] and len(set(values[:3].tolist())) == 3
    assert stats["bad_lines"] == 1 and stats["rows"] == 3
    np.testing.assert_array_equal(feats["C2"][1], [1, 1, 1])
    # The default (one-hot) layout keeps one token per field, and says what it dropped.
    with pytest.warns(pstrain.CriteoWarning, match="dropped 2 tokens.*layout= or spec="):
        _, _, ids = pstrain.read_criteo(str(path))
    assert ids[0, 0] == values[0] and ids.shape == (3, 26)


def test_issue_42_read_criteo_takes_a_model_spec(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('name = "s"\nbottom_mlp = [4]\ntop_mlp = [1]\n[sparse]\ndim = 4\n'
                    '[[feature]]\ncolumn = "C1"\ntable = "shared"\ntokens = 2\n'
                    '[[feature]]\ncolumn = "C3"\ntable = "shared"\n')
    dense = "\t".join(["1"] * 13)
    path = tmp_path / "d.tsv"
    path.write_text(f"1\t{dense}\ta1|b2\tc3\ta1" + "\t" * 23 + "\n")
    _, _, feats = pstrain.read_criteo(str(path), spec=str(spec))
    assert list(feats) == ["C1", "C3"] and list(feats["C1"][1]) == [2]
    # One table: the same token has the same id in both features.
    assert feats["C1"][0][0] == feats["C3"][0][0]


def test_issue_42_checkpoint_restores_from_python(tmp_path):
    with pstrain.LocalCluster(servers=2, checkpoint_root=str(tmp_path)) as c, \
            pstrain.Client(c.servers, c.tls_dir) as client:
        coll = EmbeddingCollection(client, [EmbeddingTable("r", 4, optimizer="row_adagrad", lr=0.1)])
        f = JaggedFeatures.from_dense(["r"], np.arange(50, dtype=np.int64).reshape(50, 1))
        coll(f)["r"].pow(2).sum().backward()
        with pytest.raises(ValueError, match="outside the checkpoint root"):
            coll.checkpoint(str(tmp_path.parent / "elsewhere"))
        coll.checkpoint("snap")  # relative to the checkpoint root
        want = client.pull("r", np.arange(50, dtype=np.int64))
    with pstrain.LocalCluster(servers=3, restore_from=str(tmp_path / "snap")) as c2:
        with pstrain.Client(c2.servers, c2.tls_dir) as client:
            client.register_table("r", dim=4, optimizer="row_adagrad", lr=0.1)
            np.testing.assert_array_equal(client.pull("r", np.arange(50, dtype=np.int64)), want)


def test_issue_42_state_dict_refuses_to_drop_a_table_silently(client, table_name):
    coll = EmbeddingCollection(client, [EmbeddingTable(table_name, 4)])
    with pytest.raises(RuntimeError, match=f"table '{table_name}' has no num_embeddings"):
        torch.nn.Sequential(coll).state_dict()
    sized = EmbeddingCollection(client, [EmbeddingTable(table_name + "s", 4, num_embeddings=10)])
    sd = sized.state_dict()
    assert sd[f"tables.{table_name}s.weight"].shape == (10, 4)


def test_issue_42_outputs_follow_the_input_device(client, table_name):
    from pstrain.torchrec import EmbeddingBagCollection
    from torchrec import EmbeddingBagConfig, KeyedJaggedTensor

    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name=table_name, embedding_dim=4, num_embeddings=10,
                                                     feature_names=["f"])], client)
    kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1, 2], device="cpu"), lengths=torch.tensor([1, 1]))
    assert ebc(kjt).values().device == kjt.values().device


def test_issue_42_types_and_docs_ship():
    import pstrain.torchrec as tr

    root = Path(pstrain.__file__).parent
    assert (root / "py.typed").is_file()
    for stub in ("_pstrain.pyi",):
        assert (root / stub).is_file()
    from pstrain.torch import EmbeddingCollection as TorchCollection

    assert "KeyedJaggedTensor" in tr.EmbeddingBagCollection.__doc__ and ">>>" not in tr.__doc__
    assert "import pstrain" in tr.__doc__  # an example
    for cls in (tr.EmbeddingBagCollection, tr.EmbeddingCollection, TorchCollection):
        # help() shows the class's own __init__ doc, not nn.Module's generic one.
        assert "client" in cls.__init__.__doc__, cls


def test_issue_42_attaching_to_a_held_table_keeps_its_seed(cluster, table_name):
    """Seeds by name must not stop a process from attaching to a table the cluster holds with another seed
    (one the Rust trainer or another job registered): the held table's seed is kept."""
    first = pstrain.Client(cluster.servers, cluster.tls_dir)
    first.register_table(table_name, dim=3, seed=7)
    later = pstrain.Client(cluster.servers, cluster.tls_dir)
    later.register_table(table_name, dim=3)
    ids = np.arange(5, dtype=np.int64)
    np.testing.assert_array_equal(later.pull(table_name, ids), first.pull(table_name, ids))
    first.close()
    later.close()
