"""`store-rollout update STORE --image VERSION` and `store-rollout revert STORE`: one store's image
update (flows/image_update.py) or revert (flows/image_revert.py), run in this process like
`rollback` (the deployments store-image-update and store-image-revert run the same flows). Both
show what they would do and stop unless confirmed with `--yes`."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from app.backup import backup
from app.offline import Confirmed, Now, RequiredInventory
from app.runner import console, refuse, refuse_settings
from app.undo import Approver, Code, proven_at_terminal, terminal_person
from store_rollout.guard import WHAT, Action
from store_rollout.settings import SettingsError


def validate_update(store_id: str, inventory: Path, image: str | None) -> None:
    """The store, its region, the settings and (an update) the version, refused here before
    anything starts."""
    from store_rollout.image_versions import ImageVersionError
    from store_rollout.inventory import InventoryError, load_inventory
    from store_rollout.settings import load_settings
    from store_rollout.settings_parts import ImageSettings
    from store_rollout.updates import target_version
    from tasks.preflight import PreflightError, check_region

    try:
        store, settings = load_inventory(inventory).get(store_id), load_settings()
        check_region(store, settings)
        if image is not None:
            target_version(ImageSettings.of(settings), image, store.vm.image_version)
    except SettingsError as exc:
        refuse_settings(exc)
    except (InventoryError, PreflightError, ImageVersionError, ValueError) as exc:
        refuse(str(exc))


def confirmed_by(what: str, store_id: str, approver: str, code: str) -> tuple[str, str]:
    """(approver, code) of a `--yes`: under the approval policy destructive an update or revert
    needs nobody (it destroys nothing); `always` wants a proven approver, as rollback does."""
    from store_rollout.settings import load_settings

    try:
        policy = load_settings().approval_policy
    except SettingsError as exc:
        refuse_settings(exc)
    if policy == "destructive" and not approver and not code:
        return "", ""
    return proven_at_terminal(what, store_id, approver, code)


def run_image_flow(action: Action, store_id: str, inventory: Path, *, now: bool, approver: str,
                   code: str, **params: Any) -> dict[str, Any]:
    """The update or revert flow in this process; exits 1 naming its state when it fails (a
    reverted update names the check that failed and says it reverted)."""
    from flows.image_revert import store_image_revert
    from flows.image_update import store_image_update

    what = action.value
    run: Any = store_image_update if action is Action.UPDATE_IMAGE else store_image_revert
    with contextlib.redirect_stdout(sys.stderr):  # Salt prints to stdout: kept for the result
        state = run(store_id, str(inventory.resolve()), return_state=True, approver=approver,
                    code=code, asked_by=f"{terminal_person()}: store-rollout {what} {store_id}",
                    ignore_windows=now, **params)
    if not state.is_completed():
        console.print(f"[red]{what} of {store_id} {state.name}:[/] {state.message}",
                      soft_wrap=True)
        raise typer.Exit(1)
    return dict(state.result())


def confirmed_run(action: Action, store_id: str, inventory: Path, what: str, *, yes: bool,
                  now: bool, approver: str, code: str, **params: Any) -> None:
    """Checked, shown and stopped without `--yes`, else run and its result printed."""
    validate_update(store_id, inventory, params.get("image_version"))
    if not yes:
        refuse(f"{what} {WHAT[action]}: add --yes to go on (in the store's maintenance window; "
               "--now outside it, with --approver NAME --code CODE)")
    approver, code = confirmed_by(action.value, store_id, approver, code)
    print(json.dumps(run_image_flow(action, store_id, inventory, now=now, approver=approver,
                                    code=code, **params), indent=2, default=str))


def update(
    store_id: str,
    image: Annotated[str, typer.Option("--image", help="the image version to run (one of the "
                                                       "settings' image_versions)")],
    inventory: RequiredInventory,
    yes: Confirmed = False,
    now: Now = False,
    approver: Approver = "",
    code: Code = "",
) -> None:
    """Update a live store server to image VERSION in its maintenance window: staged ahead,
    then shut down, switched to a new system disk, booted and checked (update highstate,
    version, go-live gate); a failing check reverts it by itself. Shows what it would do;
    `--yes` goes on (`--now` outside the window, with --approver NAME --code CODE)."""
    confirmed_run(Action.UPDATE_IMAGE, store_id, inventory, f"update of store {store_id} to "
                  f"{image}", yes=yes, now=now, approver=approver, code=code, image_version=image)


def revert(store_id: str, inventory: RequiredInventory, yes: Confirmed = False,
           now: Now = False, approver: Approver = "", code: Code = "") -> None:
    """Revert a store server to the system disk it ran before its last image update (kept
    image_keep_previous_hours after it). Shows what it would do; `--yes` goes on (in the
    store's maintenance window; `--now` outside it, with --approver NAME --code CODE)."""
    confirmed_run(Action.REVERT_IMAGE, store_id, inventory, f"revert of store {store_id}",
                  yes=yes, now=now, approver=approver, code=code)


# registered by app/cli.py (with the data disk's backup, which a store's update keeps)
IMAGE_COMMANDS = (("update", update), ("revert", revert), ("backup", backup))
