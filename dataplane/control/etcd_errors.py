"""What the etcd client raises: one module below the transport (control/etcd.py), its watch
(control/etcd_watch.py) and flannel's keys (control/registry.py), so that each of them, and the
daemon that catches them, imports the errors without importing another (or gRPC).

Two kinds matter to a caller (the transport's docstring says how each is logged): etcd unreachable
(RegistryUnavailableError: a retry may succeed) and a refusal no retry mends until an operator acts
(RegistryDeniedError, with the flag to fix).
"""
from __future__ import annotations


class RegistryError(Exception):
    """etcd could not be reached on any endpoint, or refused the request."""


class RegistryClosedError(RegistryError):
    pass


class CompactedError(RegistryError):
    def __init__(self, compact_revision: int):
        super().__init__(f"required revision has been compacted (compact revision {compact_revision})")
        self.compact_revision = compact_revision


class RewoundError(CompactedError):
    """etcd is at a revision below our cursor: restored from an older backup (or a new cluster at
    the same endpoints). Events past its revision will come again with other contents, and
    whatever happened after the backup is gone, so the watcher lists anew, as after a compaction."""

    def __init__(self, revision: int, cursor: int):
        RegistryError.__init__(self, f"etcd is at revision {revision}, behind our cursor {cursor} "
                                     "(restored from an older backup?)")
        self.compact_revision = revision


class RegistryUnavailableError(RegistryError):
    """No endpoint answered (down, unreachable, the connection closed): a retry may succeed."""


class RegistryDeniedError(RegistryError):
    """etcd refused us in a way no retry mends until an operator acts: the message says what was
    refused and which flag (or which etcd role) to fix. ``reason`` is one of REFUSALS."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


# Why etcd refused us (RegistryDeniedError.reason): "auth" (user and password), "permission" (the
# user's role, per operation), and the TLS handshake: "tls-client" (our certificate refused, or none
# given where one is required), "tls-server" (etcd's certificate not trusted by our CA),
# "tls-name" (etcd's certificate does not name the endpoint), "tls-files" (our TLS files unusable).
REFUSALS = ("auth", "permission", "tls-client", "tls-server", "tls-name", "tls-files")
# A refused handshake is the endpoint's, not the cluster's: another endpoint may take us.
TLS_REFUSALS = frozenset(r for r in REFUSALS if r.startswith("tls-"))
