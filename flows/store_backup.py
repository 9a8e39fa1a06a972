"""Back up one store's data disk (issue 48): in the store's window, the VM's minion runs restic
to the region's backup server (append-only for it), then the orchestrator verifies (the new
snapshot listed by the admin side, `restic check`) and applies the retention (backup_keep_*);
the `backup-<store>` artifact says what was kept. A backup disrupts nothing: no approval.

Wiring only: the calls are tasks/store_backup.py and tasks/backup.py, the decisions
store_rollout/backups.py. A schedule per region: deployment `store-backup` with a schedule per
store (docs/operations.md, "Backups").
"""

from __future__ import annotations

from typing import Any

from prefect import flow, tags
from prefect.artifacts import create_markdown_artifact

from store_rollout.backups import backup_markdown, verified
from store_rollout.inventory import load_inventory
from store_rollout.settings import load_settings
from store_rollout.settings_backup import BackupPart
from store_rollout.settings_parts import CalendarSettings, SaltSettings
from tasks.backup import apply_retention, backup_credentials, check_repository, list_snapshots
from tasks.notifications import notify_failure
from tasks.preflight import check_region
from tasks.run_health import beating
from tasks.store_backup import run_store_backup, wait_for_backup_window


@flow(name="store-backup", flow_run_name="backup-{store_id}", on_failure=[notify_failure])
@beating
def store_backup(store_id: str, inventory: str, ignore_windows: bool = False) -> dict[str, Any]:
    """Back up one store's data disk to the region's backup server, verify it, prune old ones.

    Args:
        store_id: The store, as written in the inventory.
        inventory: Inventory file (YAML or CSV) on the worker's host.
        ignore_windows: Start now even outside the store's maintenance windows.
    """
    store = load_inventory(inventory).get(store_id)
    settings = load_settings()
    check_region(store, settings)
    backup = BackupPart.of(settings)
    backup_credentials(backup)  # refuses (naming the setting) before anything runs
    window = wait_for_backup_window(store, CalendarSettings.of(settings), ignore_windows)
    vm = store.vm_minion_id
    with tags(f"store-{store_id}", "store-backup"):
        made = run_store_backup(store, SaltSettings.of(settings))
        snapshot = verified(store_id, made, list_snapshots(vm, backup),
                            check_repository(vm, backup))
        kept = apply_retention(vm, backup)
    result = {"store_id": store_id, "vm_minion": vm, "snapshot": snapshot["id"],
              "short_id": snapshot["short_id"], "time": snapshot["time"],
              "files": made["files"], "bytes": made["bytes"], "added_bytes": made["added_bytes"],
              "seconds": made["seconds"], "verified": True, "retention": kept,
              "keep_daily": backup.backup_keep_daily, "keep_weekly": backup.backup_keep_weekly,
              "window": window}
    create_markdown_artifact(key=f"backup-{store_id}", markdown=backup_markdown(result),
                             description=f"store {store_id} backup")
    return result
