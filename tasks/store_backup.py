"""A store's backup (issue 48), the VM's side through the Salt master: the VM's minion runs
restic (salt_states/_modules/storebackup.py) with the credentials only its pillar holds (no
secret is ever a call's argument); the orchestrator then verifies and prunes through the admin
endpoint (tasks/backup.py). And a replacement's restore: after firstboot, before the go-live
gate, the store's newest snapshot into the new VM's data disk.
"""

from __future__ import annotations

from typing import Any, Final

from prefect import get_run_logger, task

from store_rollout.backups import backup_window
from store_rollout.fleet.backups import EMPTY_DATA_DISK
from store_rollout.inventory import Store
from store_rollout.settings_backup import BackupPart
from store_rollout.settings_parts import CalendarSettings, SaltSettings
from tasks.backup import age_hours, backup_admin
from tasks.retry import SALT_WAIT_RETRY
from tasks.salt import SaltTransientError, master_client
from tasks.salt.probes import contested_key
from tasks.windows import wait_for_window

RUN_TIMEOUT: Final = 6 * 3600.0  # seconds storebackup.run or .restore may take on the VM


def wait_for_backup_window(store: Store, calendar: CalendarSettings,
                           ignore_windows: bool) -> str:
    """Wait (the run's state says until when) for the store's window; its reason."""
    decision = backup_window(store, calendar, ignore_windows)
    if not decision.go:
        wait_for_window(store.store_id, {"wait_until": decision.wait_until,
                                         "reason": decision.reason})
        decision = backup_window(store, calendar, ignore_windows)
    get_run_logger().info("store %s: %s", store.store_id, decision.reason)
    return decision.reason


@task(name="store_backup", task_run_name="backup-{store.store_id}",
      **SALT_WAIT_RETRY.on(SaltTransientError))
def run_store_backup(store: Store, salt: SaltSettings) -> dict[str, Any]:
    """storebackup.run on the store's VM (its modules synced first): the new snapshot."""
    master = master_client(salt.salt_master_config)
    vm = store.vm_minion_id
    contested_key(master, store.store_id, vm, role="VM")
    master.cmd(vm, "saltutil.sync_modules", timeout=120)
    made: dict[str, Any] = master.cmd(vm, "storebackup.run", timeout=RUN_TIMEOUT)
    get_run_logger().info("store %s: snapshot %s, %s files, %s bytes (%s new)", store.store_id,
                          made["short_id"], made["files"], made["bytes"], made["added_bytes"])
    return made


@task(name="restore_backup", task_run_name="restore-backup-{store.store_id}",
      **SALT_WAIT_RETRY.on(SaltTransientError))
def restore_newest_backup(store: Store, salt: SaltSettings,
                          backup: BackupPart) -> dict[str, Any]:
    """A replacement's data disk: the store's newest snapshot restored into the new VM's data
    disk, once per VM (a rerun reports the restore it had). {"snapshot", "short_id", "time",
    "age_hours", "seconds", "already"}, or {"snapshot": None, "note"} when backups are not
    configured or the store has none (it starts with an empty data disk)."""
    logger = get_run_logger()
    if not backup.backup_url:
        return {"snapshot": None, "note": "backups are not configured (backup_url): the new "
                "VM starts with an empty data disk"}
    listed = backup_admin(backup).snapshots(store.vm_minion_id)
    if not listed:
        logger.warning("store %s: %s", store.store_id, EMPTY_DATA_DISK)
        return {"snapshot": None, "note": EMPTY_DATA_DISK}
    master = master_client(salt.salt_master_config)
    contested_key(master, store.store_id, store.vm_minion_id, role="VM")
    master.cmd(store.vm_minion_id, "saltutil.sync_modules", timeout=120)
    done = master.cmd(store.vm_minion_id, "storebackup.restore", [listed[-1]["id"]],
                      timeout=RUN_TIMEOUT)
    used = next((s for s in listed if s["id"] == done["snapshot"]),
                {"id": done["snapshot"], "short_id": done["snapshot"][:8], "time": "?"})
    age = age_hours(used) if used["time"] != "?" else None  # pruned since
    logger.info("store %s: data disk %s backup %s of %s (%s h old)", store.store_id,
                "had its restore from" if done["already"] else "restored from",
                used["short_id"], used["time"], age)
    return {"snapshot": used["id"], "short_id": used["short_id"], "time": used["time"],
            "age_hours": age, "seconds": done["seconds"], "already": done["already"]}
