"""`store-rollout backup STORE`: one store's data disk backed up now, in this process, by the
flow the `store-backup` deployment runs (flows/store_backup.py): in the store's window (`--now`:
outside it), verified and pruned. A backup disrupts nothing: no confirmation or approval."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Annotated, Any

import typer

from app.offline import Now, RequiredInventory
from app.runner import console, refuse, refuse_settings
from store_rollout.settings import SettingsError


def _checked(store_id: str, inventory: Any) -> None:
    """The store, its region and a configured backup target, refused before anything runs."""
    from store_rollout.inventory import InventoryError, load_inventory
    from store_rollout.settings import load_settings
    from tasks.preflight import PreflightError, check_region

    try:
        store, settings = load_inventory(inventory).get(store_id), load_settings()
        check_region(store, settings)
    except SettingsError as exc:
        refuse_settings(exc)
    except (InventoryError, PreflightError, ValueError) as exc:
        refuse(str(exc))
    if not settings.backup_url:
        refuse("backup_url is empty: no backup target is configured (set "
               "STORE_ROLLOUT_BACKUP_URL to the region's restic REST server)")


def backup(store_id: str, inventory: RequiredInventory, now: Now = False,
           as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")]
           = False) -> None:
    """Back up a store's data disk to the region's backup server now (in its maintenance
    window; `--now` outside it), verify it and apply the retention."""
    from flows.store_backup import store_backup

    _checked(store_id, inventory)
    with contextlib.redirect_stdout(sys.stderr):  # Salt prints to stdout: kept for the result
        state = store_backup(store_id, str(inventory.resolve()), ignore_windows=now,
                             return_state=True)
    if not state.is_completed():
        console.print(f"[red]backup of {store_id} {state.name}:[/] {state.message}",
                      soft_wrap=True)
        raise typer.Exit(1)
    result = dict(state.result())
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(f"store {store_id}: backup {result['short_id']} at {result['time']} "
              f"({result['files']} files, {result['bytes']} bytes), verified; retention kept "
              f"{len(result['retention']['kept'])}, removed {len(result['retention']['removed'])}")
