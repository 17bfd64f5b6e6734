"""The numpy API against a real cluster: rows, updates, handles, and bad input."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import pstrain


def test_pull_creates_rows_deterministically_and_repeats_duplicates(client, table_name):
    client.register_table(table_name, dim=4, init="uniform", init_scale=0.5, seed=3)
    ids = np.array([5, 9, 5, 1 << 40], dtype=np.int64)
    rows = client.pull(table_name, ids)
    assert rows.dtype == np.float32 and rows.shape == (4, 4)
    assert rows.flags.owndata or rows.base is not None
    np.testing.assert_array_equal(rows[0], rows[2])
    assert np.abs(rows).max() <= 0.5 and np.abs(rows).max() > 0
    again = client.pull(table_name, ids.astype(np.uint64))
    np.testing.assert_array_equal(rows, again)
    assert client.pull(table_name, np.array([], dtype=np.int64)).shape == (0, 4)


def test_sgd_push_is_exact_and_duplicates_are_summed(client, table_name):
    client.register_table(table_name, dim=3, optimizer="sgd", lr=0.5, init_scale=0.0)
    ids = np.array([2, 7, 2], dtype=np.int64)
    grads = np.array([[1, 2, 3], [4, 5, 6], [10, 20, 30]], dtype=np.float32)
    assert client.push(table_name, ids, grads) == 2
    rows = client.pull(table_name, np.array([2, 7], dtype=np.int64))
    np.testing.assert_allclose(rows, [[-5.5, -11, -16.5], [-2, -2.5, -3]])


def test_half_precision_tables_hold_half_weights_and_refuse_what_they_cannot_hold(client, table_name):
    # bf16 rows (issue 43): every pulled weight is a bf16 value (low 16 bits zero), before and after pushes.
    client.register_table(table_name, dim=6, optimizer="row_adagrad", lr=0.1, init_scale=0.5, precision="bf16")
    ids = np.arange(200, dtype=np.int64)
    for _ in range(3):
        client.push(table_name, ids, np.full((200, 6), 0.37, np.float32))
    rows = client.pull(table_name, ids)
    assert (rows.view(np.uint32) & 0xFFFF == 0).all()
    assert np.abs(rows).max() > 0
    # Weights written from outside must be bf16 values: 0.1 is not, and the error (a bad request: ValueError)
    # names both precisions.
    with pytest.raises(ValueError, match="not exact in the table's bf16 rows"):
        client.write(table_name, np.array([1], dtype=np.int64), np.full((1, 6), 0.1, np.float32))
    client.write(table_name, np.array([1], dtype=np.int64), np.full((1, 6), 0.5, np.float32))
    np.testing.assert_array_equal(client.pull(table_name, np.array([1], dtype=np.int64)), np.full((1, 6), 0.5))
    with pytest.raises(ValueError, match="precision"):
        client.register_table(table_name + "_x", dim=4, optimizer="row_adagrad", precision="int8")
    with pytest.raises(ValueError, match="precision = f16"):
        client.register_table(table_name + "_sgd", dim=4, optimizer="sgd", precision="f16")
    # bf16 Adam moments (issue 43): refused for optimizers without moments, naming the field.
    client.register_table(table_name + "_adam", dim=4, optimizer="adam", lr=0.01, precision="bf16",
                          state_precision="bf16")
    for _ in range(3):
        client.push(table_name + "_adam", ids[:10], np.full((10, 4), 0.3, np.float32))
    assert (client.pull(table_name + "_adam", ids[:10]).view(np.uint32) & 0xFFFF == 0).all()
    with pytest.raises(ValueError, match="state_precision"):
        client.register_table(table_name + "_ra", dim=4, optimizer="row_adagrad", state_precision="bf16")


def test_async_handles_release_and_report(client, table_name):
    client.register_table(table_name, dim=8, optimizer="row_adagrad", lr=0.1)
    ids = np.arange(1000, dtype=np.int64)
    h = client.pull_async(table_name, ids)
    ids[:] = 0  # the call copied the ids: reusing the array changes nothing
    rows = h.wait()
    assert h.done()
    with pytest.raises(RuntimeError, match="already taken"):
        h.wait()
    assert len(np.unique(rows[:, 0])) > 900
    p = client.push_async(table_name, np.arange(1000, dtype=np.int64), np.ones((1000, 8), np.float32))
    assert p.wait() == 1000
    s = client.stats()
    assert s["pull_calls"] >= 1 and s["push_rows"] >= 1000 and s["pull_seconds"] > 0


def test_bad_input_is_named(client, table_name):
    client.register_table(table_name, dim=2)
    with pytest.raises(TypeError, match="ids dtype int32"):
        client.pull(table_name, np.array([1], dtype=np.int32))
    with pytest.raises(TypeError, match="numpy array"):
        client.pull(table_name, [1, 2])
    with pytest.raises(ValueError, match="1-D"):
        client.pull(table_name, np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match=r"ids\[1\] = -3 is out of range"):
        client.pull(table_name, np.array([1, -3], dtype=np.int64))
    with pytest.raises(KeyError, match="unknown table 'nope'"):
        client.pull("nope", np.array([1], dtype=np.int64))
    ids = np.array([1, 2], dtype=np.int64)
    with pytest.raises(TypeError, match="grads dtype float64"):
        client.push(table_name, ids, np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"grads shape \(2, 3\), expected \(2, 2\)"):
        client.push(table_name, ids, np.zeros((2, 3), np.float32))
    bad = np.zeros((2, 2), np.float32)
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match=r"grads\[1, 0\] = nan"):
        client.push(table_name, ids, bad)
    with pytest.raises(ValueError, match="dim = 5, but the cluster holds it with dim 2"):
        pstrain.Client(client_servers(client), client_tls(client)).register_table(table_name, dim=5)
    with pytest.raises(ValueError, match="optimizer = 'lion'"):
        client.register_table(table_name + "x", dim=2, optimizer="lion")
    with pytest.raises(ValueError, match="dim = 0"):
        client.register_table(table_name + "y", dim=0)
    # The server validates what the client does not: a learning rate of 0.
    with pytest.raises(ValueError, match="lr"):
        client.register_table(table_name + "z", dim=2, lr=0.0)


def client_servers(client):
    return client._servers


def client_tls(client):
    return client._tls_dir


def test_no_cluster_raises_within_the_timeout(tmp_path, cluster):
    # A port nothing listens on (UDP: no answer at all), with the real cluster's certificates.
    start = time.monotonic()
    with pytest.raises((pstrain.PsConnectionError, pstrain.PsTimeoutError)):
        pstrain.Client(["127.0.0.1:9"], cluster.tls_dir, timeout_secs=2)
    assert time.monotonic() - start < 30
    with pytest.raises(ValueError, match="no ca.pem"):
        pstrain.Client(["127.0.0.1:9"], str(tmp_path))
    with pytest.raises(ValueError, match="not host:port"):
        pstrain.Client(["localhost"], cluster.tls_dir)


def test_server_killed_mid_call_raises_within_the_timeout():
    with pstrain.LocalCluster(servers=1) as c:
        client = pstrain.Client(c.servers, c.tls_dir, timeout_secs=3)
        client.register_table("k", dim=16)
        client.pull("k", np.arange(10, dtype=np.int64))
        handles = [client.pull_async("k", np.arange(i, 200_000 + i, dtype=np.int64)) for i in range(4)]
        c.kill(0)
        start = time.monotonic()
        with pytest.raises((pstrain.PsConnectionError, pstrain.PsTimeoutError)):
            for h in handles:
                h.wait()
            client.pull("k", np.arange(10, dtype=np.int64))
        # No hang: the client's deadline (3 s), not the 30 s defaults, bounds each call.
        assert time.monotonic() - start < 20
        with pytest.raises(RuntimeError):
            c.stop(timeout_secs=5)  # the killed server did not exit cleanly


def test_package_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import pstrain, numpy\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n    import pstrain.torch\nexcept ImportError:\n    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_unique_inverse_matches_numpy():
    from pstrain import _pstrain

    rng = np.random.default_rng(3)
    ids = rng.integers(0, 50, 1000).astype(np.uint64)
    u, inv = _pstrain.unique_inverse(ids)
    np.testing.assert_array_equal(u[inv], ids)
    assert len(u) == len(np.unique(ids)) and inv.dtype == np.int64
    first = [int(x) for x in dict.fromkeys(ids.tolist())]
    np.testing.assert_array_equal(u, first)


def test_pull_many_concatenates_tables(client, table_name):
    a = client.register_table(table_name + "a", dim=2, init_scale=0.2, seed=1)
    b = client.register_table(table_name + "b", dim=2, init_scale=0.2, seed=2)
    ia, ib = np.array([1, 2, 1], dtype=np.int64), np.array([7], dtype=np.int64)
    both = client.pull_many([a, b], [ia, ib]).wait(concat=True)
    np.testing.assert_array_equal(both, np.concatenate([client.pull(a, ia), client.pull(b, ib)]))
    ra, rb = client.pull_many([a, b], [ia, ib]).wait()
    np.testing.assert_array_equal(ra, both[:3])
    assert client.push_many([a, b], [ia, ib], [np.ones((3, 2), np.float32), np.ones((1, 2), np.float32)]).wait() == 3


def test_a_score_cap_keeps_the_rows_scored_highest():
    # Issue 43: a table evicting by score (cap 4 rows) on a real server with an expiry pass every 0.2 s keeps
    # the 4 ids scored highest; the other 6, pushed as often, read as new once the pass deletes them.
    with pstrain.LocalCluster(servers=1, extra_args=["--expire-interval-secs", "0.2"]) as cluster:
        c = pstrain.Client(cluster.servers, cluster.tls_dir, timeout_secs=20)
        t = c.register_table("items", 4, optimizer="row_adagrad", lr=0.1, init_scale=0.5,
                             eviction={"policy": "score", "max_rows": 4, "decay_secs": 3600})
        # A pass between the push and the scores may delete some of the ids to score (every row is at 0
        # then): such a round is repeated with fresh ids scored above every earlier round's.
        for rnd in range(20):
            ids = np.arange(10, dtype=np.int64) + 100 * rnd
            init = c.pull(t, ids)
            c.push(t, ids, np.full((10, 4), 0.5, np.float32))
            top = 1000.0 * (rnd + 1)
            # Id 6 twice: its scores add up.
            scored = c.score(t, np.concatenate([ids[6:], ids[6:7]]),
                             np.array([top, top + 1, top + 2, top + 3, 5.0], np.float32))
            if scored == 4:
                break
        else:
            pytest.fail("an expiry pass ran between every push and its scores")
        deadline = time.monotonic() + 15
        while True:
            now = c.pull(t, ids)
            if all(np.array_equal(now[i], init[i]) for i in range(6)):
                break
            assert time.monotonic() < deadline, "the unscored rows were not deleted"
            time.sleep(0.05)
        for i in range(6, 10):
            assert not np.array_equal(now[i], init[i]), f"scored id {ids[i]} was deleted"
        assert c.score(t, np.array([999_999], np.int64), [1.0]) == 0, "an id without a row is not scored"
        assert c.score_many([t], [ids[6:]], [np.ones(4)]) == 4
        with pytest.raises(ValueError, match="1 id and 2 score arrays for 1 tables"):
            c.score_many([t], [ids], [np.ones(10), np.ones(10)])
        with pytest.raises(ValueError, match="mode = 'max'"):
            c.score(t, ids, np.ones(10), mode="max")
        with pytest.raises(ValueError, match="not a finite value >= 0"):
            c.score(t, ids[:1], [-1.0])
        with pytest.raises(ValueError, match="2 scores for 1 ids"):
            c.score(t, ids[:1], [1.0, 2.0])
        plain = c.register_table("plain", 4, optimizer="row_adagrad")
        with pytest.raises(ValueError, match="keeps none"):
            c.score(plain, ids[:1], [1.0])
        with pytest.raises(ValueError, match="unknown keys \\['ttl'\\]"):
            c.register_table("x", 4, eviction={"policy": "score", "max_rows": 1, "ttl": 3})
        with pytest.raises(ValueError, match="max_rows or max_bytes"):
            c.register_table("y", 4, optimizer="row_adagrad", eviction={"policy": "score"})
        c.close()


def test_io_threads_do_not_preempt_the_training_thread(client, table_name):
    """The extension's I/O threads run as Linux SCHED_BATCH (``PSTRAIN_IO_SCHED``, batch by default): a request
    the training thread hands them waits for a free core or the scheduler's tick instead of preempting that
    thread or torch's workers. The thread calling the client keeps its own policy."""
    if not sys.platform.startswith("linux"):
        pytest.skip("scheduling policies are Linux's")
    client.register_table(table_name, dim=4)
    client.pull(table_name, np.arange(8, dtype=np.uint64))

    def policy(tid):
        with open(f"/proc/self/task/{tid}/stat") as f:
            # Field 41 (1-based) of proc(5)'s stat: the policy; fields after the command's closing parenthesis.
            return int(f.read().rsplit(")", 1)[1].split()[38])

    io = [tid for tid in os.listdir("/proc/self/task")
          if open(f"/proc/self/task/{tid}/comm").read().strip() == "pstrain-io"]
    assert io, "no pstrain-io thread in this process"
    assert {policy(tid) for tid in io} == {os.SCHED_BATCH}
    assert policy(threading.get_native_id()) == os.SCHED_OTHER


def test_a_bad_io_scheduling_policy_is_named(cluster, monkeypatch):
    monkeypatch.setenv("PSTRAIN_IO_SCHED", "fastest")
    with pytest.raises(ValueError, match="PSTRAIN_IO_SCHED.*fastest"):
        pstrain.Client(cluster.servers, cluster.tls_dir)
