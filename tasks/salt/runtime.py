"""Salt's runtime, readied once per process before the first use of its API (never at import).

Salt's loader is not thread-safe either: `SALT_LOADING` serialises building its clients.
"""

from __future__ import annotations

import functools
import logging
import threading
import warnings
from typing import Any

# Salt's loader is not thread-safe: a batch's stores (threads of one process) that built their
# clients at once failed in salt.grains.core ("'NoneType' object has no attribute 'copy'") while
# the wheel client loaded the master's grains. Clients are built, and used first, one at a time.
SALT_LOADING = threading.Lock()


@functools.cache
def prepare_salt_runtime() -> None:
    """Once per process, before the first use of Salt's API (never at import time).

    Salt modules call log.trace()/log.garbage(); loggers a host process (pytest, a worker)
    created before Salt installed its logger class lack them. Salt 3008 also logs "unclosed
    MasterMinion" for objects its own clients create internally, and importing it on Python
    3.11 warns that 'crypt' is deprecated."""
    warnings.filterwarnings("ignore", message=".*'crypt' is deprecated", category=DeprecationWarning)
    import salt._logging  # noqa: F401  registers the TRACE and GARBAGE levels

    for name, level in (("trace", 5), ("garbage", 1)):
        if not hasattr(logging.Logger, name):
            def emit(self: logging.Logger, msg: object, *args: Any, _level: int = level,
                     **kwargs: Any) -> None:
                if self.isEnabledFor(_level):
                    self._log(_level, msg, args, **kwargs)
            setattr(logging.Logger, name, emit)
    logging.getLogger("salt.minion").setLevel(logging.ERROR)
    logging.getLogger("salt.wheel").setLevel(logging.ERROR)
