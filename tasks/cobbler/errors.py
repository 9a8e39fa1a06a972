"""What a Cobbler call can fail with: each error names the call (`operation`), the system or
profile it was about (`subject`, when there is one) and, for an HTTP-level failure, the
`status`; `str()` is the message a person reads. Retries key on the type (`CobblerUnavailable`)."""

from __future__ import annotations

from tasks.retry import OutsideCallFailed


class CobblerError(OutsideCallFailed):
    """A Cobbler call failed."""


class CobblerUnavailable(CobblerError):
    """Cobbler did not answer (connection refused, reset or timed out): worth retrying."""


class CobblerAuthError(CobblerError):
    """Cobbler refused the credentials (or an HTTP proxy in front of it answered 401/403)."""


class CobblerNotFound(CobblerError):
    """The named Cobbler object does not exist."""


class CobblerRejected(CobblerError):
    """Cobbler rejected a value (bad MAC, duplicate MAC/IP...), or its URL answered another 4xx."""


class _SyncRunning(CobblerError):
    """A background sync has not finished yet."""
