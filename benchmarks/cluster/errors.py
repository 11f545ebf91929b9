"""The cluster's one error type, apart so that every module of the cluster can raise it."""


class ClusterError(RuntimeError):
    """The cluster cannot start here, or one of its parts failed."""
