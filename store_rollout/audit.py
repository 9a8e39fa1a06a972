"""The audit trail: every approval, rejection, cancel, rollback, replace and decommission of a
store, one JSON line each in `store-<id>.jsonl` of the audit directory (the setting
`audit_dir`), appended, never rewritten: {time, store, action, person, run_id, decision,
reason}. `person` is a proven approver (store_rollout/approvers.py), or empty where nobody had
to prove anything (the approval policy never, a cancel). Files are created 0600 (`os.open`
with the mode, never chmod after) in a 0700 directory; `store-rollout audit export` prints
them for an auditor, tasks/audit.py also shows each store's trail as a Prefect artifact.
"""

from __future__ import annotations

import json
import os
import re
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from store_rollout.inventory.models import STORE_ID_RE

FIELDS: Final = ("time", "store", "action", "person", "run_id", "decision", "reason")
DEFAULT_AUDIT_DIR: Final = "/var/lib/store-rollout/audit"


class AuditError(RuntimeError):
    """The audit trail cannot be written or read: the action does not go on unrecorded."""


def ensure_dir(path: Path) -> None:
    """The directory, made 0700 if missing; one others can write to is refused."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = path.stat().st_mode
    except OSError as exc:
        raise AuditError(f"audit_dir {path}: {exc.strerror}: create it (owned by the workers' "
                         "user, mode 0700) or set STORE_ROLLOUT_AUDIT_DIR") from None
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise AuditError(f"audit_dir {path} is writable by others: chmod 0700 it")


def append_line(handle: int, entry: dict[str, Any]) -> None:
    """One JSON line, in one write (O_APPEND: never interleaved with another writer's)."""
    data = (json.dumps(entry, sort_keys=True, default=str) + "\n").encode()
    if os.write(handle, data) != len(data):
        raise AuditError("short write to the audit trail")


def store_file(audit_dir: Path, store_id: str) -> Path:
    if not re.match(STORE_ID_RE, store_id):
        raise AuditError(f"store {store_id!r}: not a store id")
    return audit_dir / f"store-{store_id}.jsonl"


def entry(store_id: str, action: str, person: str, run_id: str, decision: str,
          reason: str = "", now: datetime | None = None) -> dict[str, Any]:
    return {"time": (now or datetime.now(UTC)).isoformat(timespec="seconds"),
            "store": store_id, "action": action, "person": person, "run_id": run_id,
            "decision": decision, "reason": reason}


def append(audit_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Appends `record` to its store's file (created 0600); returns it."""
    ensure_dir(audit_dir)
    path = store_file(audit_dir, record["store"])
    try:
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as exc:
        raise AuditError(f"audit trail {path}: {exc.strerror}") from None
    try:
        if os.fstat(handle).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise AuditError(f"audit trail {path} is open to others: chmod 0600 it")
        append_line(handle, {key: record.get(key, "") for key in FIELDS})
    finally:
        os.close(handle)
    return record


def read(audit_dir: Path, store_id: str | None = None) -> list[dict[str, Any]]:
    """The records of one store, or of every store, oldest first."""
    paths = ([store_file(audit_dir, store_id)] if store_id
             else sorted(audit_dir.glob("store-*.jsonl")))
    records: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            records += [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(records, key=lambda r: r["time"])


def markdown(records: list[dict[str, Any]]) -> str:
    """The trail as a Markdown table (the Prefect artifact, the CLI's text)."""
    def cell(value: Any) -> str:
        return str(value or "-").replace("|", "\\|").replace("\n", " ")

    rows = ["| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    rows += ["| " + " | ".join(cell(r.get(k)) for k in FIELDS) + " |" for r in records]
    return "\n".join(rows)
