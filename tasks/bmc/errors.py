"""What a BMC call can fail with: each error names the call (`operation`) and the BMC it went to
(`subject`: the store and the BMC's address); `str()` is the message a store technician reads.
Retries key on the type (`BmcUnreachable`); a refused login is never retried (a BMC locks the
account after a few wrong passwords)."""

from __future__ import annotations

from tasks.retry import OutsideCallFailed


class BmcError(OutsideCallFailed):
    """A call to a store host's BMC failed."""


class BmcUnreachable(BmcError):
    """The BMC did not answer within its timeout (or refused the connection): worth retrying."""


class BmcAuthFailed(BmcError):
    """The BMC refused the login: the BMC Credentials Block holds a wrong user or password."""


class BmcRejected(BmcError):
    """The BMC answered but refused the request (unknown system, unsupported action)."""
