"""`store-rollout audit export [--store ID] [--json]`: the audit trail (store_rollout/audit.py)
as an auditor takes it away: every store's records, or one store's, oldest first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from app.runner import refuse, refuse_settings
from store_rollout.settings import SettingsError

audit_app = typer.Typer(no_args_is_help=True, help="The audit trail: who approved, rejected, "
                        "cancelled, rolled back, replaced or decommissioned what, and when.")


@audit_app.command("export")
def export(
    store: Annotated[str | None, typer.Option("--store", help="only this store")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="a JSON list, not a table")] = False,
    audit_dir: Annotated[Path | None, typer.Option(
        "--audit-dir", help="the trail's directory (default: the audit_dir setting)")] = None,
) -> None:
    """Print the audit trail: time, store, action, person (a proven approver), run id,
    decision, reason."""
    from store_rollout import audit

    if audit_dir is None:
        from store_rollout.settings import load_settings

        try:
            audit_dir = Path(load_settings().audit_dir)
        except SettingsError as exc:
            refuse_settings(exc)
    if not audit_dir.is_dir():
        refuse(f"--audit-dir: {audit_dir} is no directory: name the audit_dir setting's "
               "directory (STORE_ROLLOUT_AUDIT_DIR)")
    try:
        records = audit.read(audit_dir, store)
    except audit.AuditError as exc:
        refuse(f"--store: {exc}")
    if as_json:
        print(json.dumps(records, indent=2))
    else:
        print(audit.markdown(records))
