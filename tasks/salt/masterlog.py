"""The master's own log: the one place a refused auth protocol shows (it fires no event)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# what the master logs (salt/channel/server.py, 3006.17+ and 3008) when a minion's auth
# protocol is older than its minimum_auth_version: it fires no event, and the minion only
# hears "bad load"
AUTH_PROTOCOL_REFUSED = re.compile(
    r"Rejected authentication attempt from minion '(?P<minion>[^']+)' using protocol "
    r"version (?P<version>\d+) \(minimum required: (?P<minimum>\d+)\)")


@dataclass(frozen=True)
class AuthRefusal:
    """The master refused a minion's sign-in for its auth protocol version."""

    minion: str
    version: int
    minimum: int


class MasterLogTail:
    """The lines the master logs from now on (its `log_file`, on this host like the master's
    config and autosign files): the one place a refused auth protocol shows."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.offset = self._size()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size if self.path else 0
        except OSError:
            return 0

    def new_lines(self) -> list[str]:
        if self.path is None:
            return []
        size = self._size()
        if size < self.offset:  # rotated: the new file is read from its start
            self.offset = 0
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(size - self.offset)
        except OSError:
            return []
        complete = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += complete
        return data[:complete].decode(errors="replace").splitlines()

    def auth_refusals(self, minion_id: str) -> list[AuthRefusal]:
        found = (AUTH_PROTOCOL_REFUSED.search(line) for line in self.new_lines())
        return [AuthRefusal(m["minion"], int(m["version"]), int(m["minimum"]))
                for m in found if m and m["minion"] == minion_id]
