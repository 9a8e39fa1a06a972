"""Files only their owner may read, mode 0600 from the moment they exist: the mode is given to
os.open, never set by a chmod after the write (in between, anyone could open and keep them)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

PRIVATE = 0o600


def open_private(path: Path | str, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """A descriptor of `path`, created 0600 if missing (a lock file, a file to write)."""
    return os.open(path, flags, PRIVATE)


def write_private(path: Path, text: str,
                  before_replace: Callable[[Path], None] | None = None) -> None:
    """`text` into `path`, atomically: a temporary file beside it, created 0600 by os.open
    (exclusively: a leftover one, whatever its mode, is removed first), then renamed over
    `path`. `before_replace(tmp)`: e.g. handing the file to another user first."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    handle: IO[str]
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w") as handle:
        handle.write(text)
    if before_replace is not None:
        before_replace(tmp)
    tmp.replace(path)
