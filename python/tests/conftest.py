"""Fixtures: one real local cluster (two ps-server processes) for the whole session, and a client of it.

The ps-server binary comes from ``pstrain.find_binary`` (``PSTRAIN_BIN_DIR``, ``CARGO_TARGET_DIR/release`` or the
checkout's ``target/release``): build it first (``cargo build --release --workspace --bins``)."""

import itertools

import pytest

import pstrain

_names = itertools.count()


@pytest.fixture(scope="session")
def cluster():
    with pstrain.LocalCluster(servers=2) as c:
        yield c


@pytest.fixture
def client(cluster):
    c = pstrain.Client(cluster.servers, cluster.tls_dir, timeout_secs=20)
    yield c
    c.close()


@pytest.fixture
def table_name():
    """A table name no other test uses (tests share the cluster)."""
    return f"t{next(_names)}"
