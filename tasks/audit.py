"""Writing the audit trail (store_rollout/audit.py): the store's JSONL file first (what an
auditor exports), then the store's Prefect artifact `audit-<store>`, a table of its whole
trail, so the run's and the store's pages show who decided what."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from store_rollout import audit
from tasks.run_health import run_logger


def this_run_id() -> str:
    """The current flow run's id; empty outside a run."""
    return str(flow_run.id or "")


def record(settings: Any, store_id: str, action: str, person: str, decision: str,
           reason: str = "") -> dict[str, Any]:
    """Appends one record to the store's trail (an AuditError stops the caller: nothing is
    done unrecorded) and shows the trail as the store's artifact (best effort: the file is the
    record)."""
    directory = Path(settings.audit_dir)
    run_id = this_run_id()
    entry = audit.append(directory, audit.entry(store_id, action, person, run_id, decision,
                                                reason))
    if not run_id:  # no run whose page would show it (a function called outside a flow)
        return entry
    try:
        create_markdown_artifact(
            key=f"audit-{store_id}", markdown=f"# Audit trail of store {store_id}\n\n"
            + audit.markdown(audit.read(directory, store_id)),
            description=f"store {store_id}: approvals, rejections, cancels, rollbacks, "
                        "replacements and decommissions, with who decided")
    except Exception as exc:  # the API down: the file holds it, the run goes on
        run_logger(__name__).warning("store %s: audit artifact not updated (%s); the trail "
                                     "is in %s", store_id, exc, directory)
    return entry
