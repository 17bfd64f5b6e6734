"""pstrain: train recommendation models whose embedding tables live on pstrain's parameter servers.

The numpy API needs no PyTorch::

    import numpy as np, pstrain
    with pstrain.LocalCluster(servers=2) as cluster:
        client = pstrain.Client(cluster.servers, cluster.tls_dir)
        client.register_table("user", dim=16, optimizer="sgd", lr=0.1)
        rows = client.pull("user", np.array([3, 7, 3], dtype=np.int64))    # float32 [3, 16]
        client.push("user", np.array([3, 7]), np.ones((2, 16), np.float32))

``pstrain.torch`` (imported separately, it needs torch) has the ``nn.Module`` layer over such tables;
``pstrain.torchrec`` (it needs torchrec) TorchRec's ``EmbeddingBagCollection`` and ``EmbeddingCollection`` over
them.
"""

from .errors import ClusterError, PsConnectionError, PsError, PsTimeoutError
from .client import Client, PullHandle, PushHandle, Table
from .cluster import LocalCluster, find_binary
from .data import CriteoWarning, read_criteo

__all__ = [
    "Client",
    "ClusterError",
    "CriteoWarning",
    "LocalCluster",
    "PsConnectionError",
    "PsError",
    "PsTimeoutError",
    "PullHandle",
    "PushHandle",
    "Table",
    "find_binary",
    "read_criteo",
]
__version__ = "0.1.0"
