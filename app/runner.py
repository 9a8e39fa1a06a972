"""Running flows from a command in this process: the checks before anything is touched, the
one-line refusals, and the concurrent per-store runner (`store-rollout rollout`, the lab's
`demo`) with its live view.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from store_rollout.settings import SettingsError

console = Console(stderr=True)


def command_prefect_settings() -> Any:
    """The Prefect settings of a command's duration, whatever was imported before: with
    STORE_ROLLOUT_SETTINGS_FILE (and no PREFECT_API_URL) the Prefect server that file names.
    Prefect's own flow-run heartbeat is off: the flows send theirs (tasks/run_health.py), and
    Prefect's thread, sleeping in 1-s steps, held each run's return up to a second after it
    was Completed."""
    import prefect.settings
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    from store_rollout.settings_outside import prefect_settings_of_file

    # the server, its CA and the credential (PREFECT_API_AUTH_STRING) the file names
    updates: dict[Any, Any] = {getattr(prefect.settings, k): v
                               for k, v in prefect_settings_of_file().items()}
    return temporary_settings(updates={**updates, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


def validate_stores(store_ids: list[str], inventory: Path, dispatched: bool = False) -> None:
    """Inventory, store ids and settings, checked before anything is touched. `dispatched`
    (a batch): in a chain of regions each store is a run in its region's pool whose worker
    checks it against its region's systems (one region's master down fails that region's
    runs, not the others'); here each store's region must be known."""
    from store_rollout.inventory import InventoryError, load_inventory
    from store_rollout.regions import RegionsError, runs_in_region_pools
    from store_rollout.settings import load_settings
    from tasks.preflight import PreflightError, preflight

    try:
        stores, settings = load_inventory(inventory).select(store_ids), load_settings()
        if dispatched:
            regions = settings.regions()
            for store in stores:
                regions.spec(store.region, f"store {store.store_id}: region")
            if runs_in_region_pools(regions, settings.region, [s.region for s in stores]):
                stores = []
        if stores:
            preflight(stores, settings)
    except SettingsError as exc:
        refuse_settings(exc)
    except (InventoryError, PreflightError, RegionsError) as exc:
        refuse(str(exc))


def validate_rollback(store_id: str, inventory: Path) -> None:
    """The store, its region and the settings, refused here, not as a failed flow run once the
    rollback has begun (no preflight: a rollback also undoes a half-configured store)."""
    from store_rollout.inventory import InventoryError, load_inventory
    from store_rollout.settings import load_settings
    from tasks.preflight import PreflightError, check_region

    try:
        check_region(load_inventory(inventory).get(store_id), load_settings())
    except (InventoryError, PreflightError) as exc:
        refuse(str(exc))
    except SettingsError as exc:
        refuse_settings(exc)


def refuse(message: str, *more: str) -> NoReturn:
    """Exit 2 with the error as one line: rich would cut it at 80 columns where stderr is not a
    terminal (a log, a CI job); a terminal wraps it itself."""
    console.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    for line in more:
        console.print(escape(line), soft_wrap=True)
    raise typer.Exit(2)


def refuse_settings(exc: SettingsError) -> NoReturn:
    """The settings' one-line error and the lines other installs add to it (entry point group
    `store_rollout.settings_hints`, loaded only here: e.g. the settings file of a test setup
    running on this machine); the person decides, the CLI never picks one."""
    from store_rollout.plugins import SETTINGS_HINTS, registered

    hints: list[str] = []
    for entry in registered(SETTINGS_HINTS).values():
        hints += entry.load()(exc.missing)
    refuse(exc.brief, *hints)


def finished(state: Any, what: str, code: int = 1) -> Any:
    """The result of a flow run the command ran, or exit `code` naming its state and message."""
    if not state.is_completed():
        console.print(f"[red]{what} {state.name}:[/] {state.message}")
        raise typer.Exit(code)
    return state.result()


def run_stores(store_ids: list[str], inventory: Path, live: bool,
               **params: Any) -> list[dict[str, object]]:
    """Run one flow per store, concurrently, in this process; returns one summary each."""
    import contextlib
    import contextvars
    import sys
    import time
    from concurrent.futures import ThreadPoolExecutor

    from rich.live import Live

    from app.live import LiveSteps
    from flows.rollout import store_rollout
    from store_rollout import steps
    from store_rollout.approval_policy import UNAPPROVED_ENDS

    view = LiveSteps(store_ids)

    def one(sid: str) -> dict[str, object]:
        started = time.monotonic()
        state = store_rollout(sid, str(inventory.resolve()), return_state=True, **params)
        summary: dict[str, object] = {
            "store_id": sid,
            "state": state.name,
            "seconds": round(time.monotonic() - started, 1),
        }
        if state.is_completed() and state.name not in UNAPPROVED_ENDS:
            summary.update(state.result())
            summary["state"] = "Completed"
        else:  # failed, or rejected by the approver (its message says so)
            # whole: step errors name what failed and the fix (a few hundred characters)
            summary["error"] = str(state.message or "")[:2000]
        return summary

    live_cm = Live(view, console=console, refresh_per_second=4) if live else contextlib.nullcontext()
    # Salt prints to stdout; keep stdout for the --json result only
    with (
        steps.listening(view),
        live_cm,
        contextlib.redirect_stdout(sys.stderr),
        ThreadPoolExecutor(max_workers=max(1, len(store_ids))) as pool,
    ):
        # each thread runs in a copy of this context: the Prefect settings the command applied
        # (the lab's API URL) and the live view listening are context variables, which new
        # threads do not see
        contexts = {sid: contextvars.copy_context() for sid in store_ids}
        return list(pool.map(lambda sid: contexts[sid].run(one, sid), store_ids))


def run_batch(inventory: Path, store_ids: list[str], show_progress: bool, **waves: Any) -> Any:
    """The batch flow in this process with a progress bar per store; returns its final state."""
    import contextlib
    import sys

    from app.live import BatchProgress
    from flows.batch_rollout import batch_rollout
    from store_rollout import steps
    from store_rollout.inventory import load_inventory

    ids = [s.store_id for s in load_inventory(inventory).select(store_ids)]
    progress = BatchProgress(ids, console, disable=not show_progress)
    # the batch's store runs are task runs started from this context: they hear of it
    with steps.listening(progress), progress, contextlib.redirect_stdout(sys.stderr):
        return batch_rollout(str(inventory.resolve()), tuple(ids), return_state=True, **waves)


def recent_runs(limit: int) -> dict[str, list[dict[str, Any]]]:
    """The Prefect server's flow runs: `runs`, those that ran or run now, newest first, and
    `upcoming`, the scheduled ones (a batch's stores waiting for their windows), soonest
    first; each with name, flow, state, start (or scheduled start), seconds."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    def state_is(types: list[StateType], negate: bool = False) -> FlowRunFilter:
        kind = FlowRunFilterStateType(not_any_=types) if negate else FlowRunFilterStateType(any_=types)
        return FlowRunFilter(state=FlowRunFilterState(type=kind))

    scheduled = [StateType.SCHEDULED]
    with get_client(sync_client=True) as client:
        ran = client.read_flow_runs(flow_run_filter=state_is(scheduled, negate=True),
                                    sort=FlowRunSort.START_TIME_DESC, limit=limit)
        upcoming = client.read_flow_runs(flow_run_filter=state_is(scheduled),
                                         sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=limit)
        flows = {f.id: f.name for f in client.read_flows()}

    def row(r: Any, when: Any) -> dict[str, Any]:
        return {"name": r.name, "flow": flows.get(r.flow_id, "?"),
                "state": r.state.name if r.state else "?",
                "start": when.isoformat(timespec="seconds") if when else "-",
                "seconds": round(r.total_run_time.total_seconds(), 1)}

    return {"runs": [row(r, r.start_time) for r in ran],
            "upcoming": [row(r, r.expected_start_time) for r in upcoming]}


def unreachable(exc: BaseException) -> str | None:
    """One line naming the server that did not answer and the fix, when that is what `exc`
    (or an exception it was raised from) says; None for any other error."""
    import errno

    import httpx
    import requests

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, httpx.ConnectError | httpx.ConnectTimeout | httpx.ReadTimeout):
            request = getattr(seen, "_request", None)
            url = str(request.url) if request is not None else "a server"
            return _server_line(url, str(seen) or type(seen).__name__)
        if isinstance(seen, requests.ConnectionError | requests.Timeout):
            url = str(getattr(seen.request, "url", "") or "a server")
            return _server_line(url, type(seen).__name__)
        if isinstance(seen, OSError) and seen.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH,
                                                        errno.ETIMEDOUT):
            return f"a server did not answer ({seen.strerror}): check that it runs and its address"
        seen = seen.__cause__ or seen.__context__
    return None


def _server_line(url: str, reason: str) -> str:
    """Which of the rollout's servers `url` is, by the settings that name them."""
    import os

    prefect = os.environ.get("PREFECT_API_URL", "")
    if prefect and url.startswith(prefect.rstrip("/")) or "/api/" in url:
        return (f"the Prefect server at {prefect or url} does not answer ({reason}): start it "
                "or set PREFECT_API_URL to the running one")
    return f"{url} does not answer ({reason}): start that server or fix its address in the settings"


@contextmanager
def servers_answer() -> Iterator[None]:
    """Around the whole command: a server that does not answer is one line naming it and the
    fix (exit 2), never a traceback."""
    try:
        yield
    except Exception as exc:
        line = unreachable(exc)
        if line is None:
            raise
        console.print(f"[red]error:[/] {escape(line)}", soft_wrap=True)
        raise SystemExit(2) from None
