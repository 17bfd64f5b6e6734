"""Exceptions of the pstrain package.

``PsError`` is any failed request to the parameter servers; ``PsTimeoutError`` (also a ``TimeoutError``) means no
answer within the client's timeout, ``PsConnectionError`` (also a ``ConnectionError``) a server that cannot be
reached or whose connection was lost. Bad arguments raise the builtins: ``TypeError`` (wrong dtype), ``ValueError``
(wrong shape, dimension, value) and ``KeyError`` (unknown table). Every message names what was wrong.
"""


class PsError(RuntimeError):
    """A request to the parameter servers failed."""


class PsTimeoutError(PsError, TimeoutError):
    """A request did not finish within the client's timeout."""


class PsConnectionError(PsError, ConnectionError):
    """A server could not be reached, or its connection was lost."""


class ClusterError(PsError):
    """A local cluster's server failed to start or to stop cleanly (the message names the server and its log)."""
