"""`rollback` and `decommission` of one store in this process, and what every `--yes` of a
destructive command needs: an approver proven by a one-time code (`--approver NAME --code
CODE`, the code asked for when missing). The command checks the code before it starts the run,
refusing a wrong one at once; the run checks it again itself and uses it up (a run started
through the API proves nothing the command checked)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from app.runner import console, refuse, refuse_settings, validate_rollback
from store_rollout.settings import SettingsError

Approver = Annotated[str, typer.Option(
    "--approver", help="with --yes: your approver name, proven by --code")]
NoExport = Annotated[bool, typer.Option(
    "--no-export", help="decommission: remove the store's data disk without keeping an export "
                        "of it first (its data is gone for good)")]
Code = Annotated[str, typer.Option(
    "--code", help="with --approver: the one-time code your authenticator shows now (asked "
                   "for when missing)")]


def terminal_person() -> str:
    """Who typed the command: the user at this terminal, as user@host (who asked; the
    approval is the proven approver's)."""
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}"


def proven_at_terminal(what: str, store_id: str, approver: str, code: str) -> tuple[str, str]:
    """(approver, code) of a `--yes`, checked here before anything starts (not used up: the
    run checks it again and uses it). Under the approval policy never nobody needs to be
    named; a name given is checked all the same."""
    from store_rollout.approvers import ApproverError
    from store_rollout.settings import load_settings
    from tasks.approvers import prove

    try:
        settings = load_settings()
    except SettingsError as exc:
        refuse_settings(exc)
    if not approver and not code:
        if settings.approval_policy == "never":
            return "", ""
        refuse(f"{what} of store {store_id}: --yes needs --approver NAME and --code CODE (the "
               "one-time code of your authenticator): under the approval policy "
               f"{settings.approval_policy!r} a proven approver confirms it")
    if not approver:
        refuse("--approver: name the approver whose one-time code --code is")
    if not code:
        code = typer.prompt(f"one-time code of {approver}", hide_input=True)
    try:
        prove(settings, approver, code, consume=False)
    except ApproverError as exc:
        refuse(f"--code: {exc}")
    return approver, code


def run_store_undo(what: str, store_id: str, inventory: Path, confirmed: bool = False,
                   now: bool = False, approver: str = "", code: str = "",
                   keep_export: bool = True) -> dict[str, Any]:
    """`rollback` or `decommission` of one store in this process, refused before it starts
    when the store, the settings or the approver's code are wrong (`keep_export`: a
    decommission's, false for --no-export); without `confirmed`
    (--yes) it shows what it would do and exits 2; exits 1 naming the state when it fails."""
    from flows.decommission import store_decommission
    from flows.store_rollback import store_rollback
    from store_rollout.guard import WHAT, Action

    validate_rollback(store_id, inventory)
    if not confirmed:
        refuse(f"{what} of store {store_id} {WHAT[Action(what)]}"
               f"{'' if keep_export else ', and WITHOUT an export of its data disk'}: add "
               "--yes to go on, with --approver NAME --code CODE (in the store's maintenance "
               "window; --now outside it)")
    approver, code = proven_at_terminal(what, store_id, approver, code)
    person = terminal_person()
    undo: Any = store_rollback if what == "rollback" else partial(store_decommission,
                                                                  keep_export=keep_export)
    state = undo(store_id, str(inventory.resolve()), return_state=True, approver=approver,
                 code=code, asked_by=f"{person}: store-rollout {what} {store_id}",
                 ignore_windows=now)
    if not state.is_completed():
        console.print(f"[red]{what} of {store_id} {state.name}:[/] {state.message}",
                      soft_wrap=True)
        raise typer.Exit(1)
    return dict(state.result())
