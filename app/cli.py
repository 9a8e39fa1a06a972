"""`store-rollout` command line: rollouts, batches, plan, reconcile, staging, status, rollback,
vm-xml.

Sub-commands other packages register (entry point group `store_rollout.commands`, e.g. the
lab's `store-rollout lab ...`) are added without this module importing them.
"""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from store_rollout.settings import SettingsError, prefect_settings_of_file

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Roll out retail stores: KIWI image, Cobbler PXE, Salt, libvirt, ERP.",
)
console = Console(stderr=True)
COMMAND_GROUP = "store_rollout.commands"


@app.callback()
def _prefect_of_the_settings_file(ctx: typer.Context) -> None:
    """With STORE_ROLLOUT_SETTINGS_FILE (and no PREFECT_API_URL), every command talks to the
    Prefect server that file names: set as Prefect settings for the command's duration, whatever
    was imported before."""
    import os

    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_HOME,
        temporary_settings,
    )

    from tasks.run_health import HEARTBEAT_ENV

    # flow runs of this process (and of `serve`'s children) send heartbeats, so the server's
    # automation marks them Crashed if this process dies (tasks/run_health.py)
    os.environ.update({k: v for k, v in HEARTBEAT_ENV.items() if k not in os.environ})
    names = {"PREFECT_API_URL": PREFECT_API_URL, "PREFECT_HOME": PREFECT_HOME,
             "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": PREFECT_FLOWS_HEARTBEAT_FREQUENCY}
    updates = {**prefect_settings_of_file(),
               "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": os.environ["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]}
    ctx.with_resource(temporary_settings(updates={names[k]: v for k, v in updates.items()}))


Inventory = Annotated[Path, typer.Option("--inventory", "-i", help="inventory YAML or CSV")]
DEFAULT_INVENTORY = Path("examples/inventory.yaml")


def validate_stores(store_ids: list[str], inventory: Path) -> None:
    """Inventory, store ids and settings, checked before anything is touched."""
    from store_rollout.inventory import InventoryError, load_inventory
    from store_rollout.settings import load_settings
    from tasks.preflight import PreflightError, preflight

    try:
        inv = load_inventory(inventory)
        stores = inv.select(store_ids) if store_ids else list(inv.stores)
        preflight(stores, load_settings())
    except SettingsError as exc:
        refuse_settings(exc)
    except (InventoryError, PreflightError) as exc:
        refuse(str(exc))


def refuse(message: str, *more: str) -> NoReturn:
    """Exit 2 with the error as one line: rich would cut it at 80 columns where stderr is not a
    terminal (a log, a CI job); a terminal wraps it itself."""
    console.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    for line in more:
        console.print(escape(line), soft_wrap=True)
    raise typer.Exit(2)


def refuse_settings(exc: SettingsError) -> NoReturn:
    """The settings' one-line error and the lines a command plugin adds to it (`settings_hint`
    in the plugin's module: the lab names a lab running on this machine); the person decides,
    the CLI never picks one."""
    from importlib import import_module

    hints: list[str] = []
    for entry in entry_points(group=COMMAND_GROUP):
        hint = getattr(import_module(entry.module), "settings_hint", None)
        hints += hint(exc.missing) if hint is not None else []
    refuse(exc.brief, *hints)


def finished(state: Any, what: str, code: int = 1) -> Any:
    """The result of a flow run the command ran, or exit `code` naming its state and message."""
    if not state.is_completed():
        console.print(f"[red]{what} {state.name}:[/] {state.message}")
        raise typer.Exit(code)
    return state.result()


class LiveSteps:
    """A rich table of stores x steps, fed by the flow's in-process step listener."""

    def __init__(self, store_ids: list[str]) -> None:
        from store_rollout.contracts import STEPS

        self.steps = STEPS
        self.state: dict[str, dict[str, str]] = {s: {} for s in store_ids}

    def __call__(self, store_id: str, step: str, state: str, seconds: float) -> None:
        label = {
            "running": "[yellow]running[/]",
            "done": f"[green]{seconds:.1f}s[/]",
            "failed": f"[red]failed {seconds:.1f}s[/]",
        }[state]
        self.state.setdefault(store_id, {})[step] = label

    def __rich__(self) -> Table:
        table = Table(title="store rollout")
        table.add_column("store")
        for step in self.steps:
            table.add_column(step.replace("_", " "))
        for sid, steps in self.state.items():
            table.add_row(sid, *[steps.get(step, "[dim]-[/]") for step in self.steps])
        return table


def run_stores(store_ids: list[str], inventory: Path, live: bool, **params: float) -> list[dict[str, object]]:
    """Run one flow per store, concurrently, in this process; returns one summary each."""
    import contextlib
    import contextvars
    import sys
    import time
    from concurrent.futures import ThreadPoolExecutor

    from rich.live import Live

    from flows.rollout import store_rollout
    from store_rollout import steps

    view = LiveSteps(store_ids)
    steps.add_listener(view)

    def one(sid: str) -> dict[str, object]:
        started = time.monotonic()
        state = store_rollout(sid, str(inventory.resolve()), return_state=True, **params)
        summary: dict[str, object] = {
            "store_id": sid,
            "state": state.name,
            "seconds": round(time.monotonic() - started, 1),
        }
        if state.is_completed():
            summary.update(state.result())
            summary["state"] = "Completed"
        else:
            # whole: step errors name what failed and the fix (a few hundred characters)
            summary["error"] = str(state.message or "")[:2000]
        return summary

    live_cm = Live(view, console=console, refresh_per_second=4) if live else contextlib.nullcontext()
    try:
        # Salt prints to stdout; keep stdout for the --json result only
        with (
            live_cm,
            contextlib.redirect_stdout(sys.stderr),
            ThreadPoolExecutor(max_workers=max(1, len(store_ids))) as pool,
        ):
            # each thread runs in a copy of this context: the Prefect settings the command
            # applied (the lab's API URL) are context variables, which new threads do not see
            contexts = {sid: contextvars.copy_context() for sid in store_ids}
            results = list(pool.map(lambda sid: contexts[sid].run(one, sid), store_ids))
    finally:
        steps.remove_listener(view)
    return results


HypervisorStall = Annotated[float, typer.Option(
    help="seconds a hypervisor may answer without getting ready before its highstate is applied again")]


@app.command("rollout")
def rollout(
    store_id: str,
    inventory: Inventory = DEFAULT_INVENTORY,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    hypervisor_timeout: Annotated[float, typer.Option(help="seconds for step 3")] = 1800,
    firstboot_timeout: Annotated[float, typer.Option(help="seconds for step 6")] = 1800,
    vm_stall_timeout: Annotated[float, typer.Option(help="silence (s) after which a hung VM is reset")] = 300,
    hypervisor_stall_timeout: HypervisorStall = 300,
    vm_contact_timeout: Annotated[float, typer.Option(
        help="seconds step 6 waits for the VM's minion to contact the master at all")] = 600,
) -> None:
    """Roll out one store (one Prefect flow run) with a live view of its steps."""
    validate_stores([store_id], inventory)
    result = run_stores(
        [store_id],
        inventory,
        live=not as_json,
        hypervisor_timeout=hypervisor_timeout,
        firstboot_timeout=firstboot_timeout,
        vm_stall_timeout=vm_stall_timeout,
        hypervisor_stall_timeout=hypervisor_stall_timeout,
        vm_contact_timeout=vm_contact_timeout,
    )[0]
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        console.print(
            f"store {store_id}: {result['state']} in {result['seconds']}s"
            + (f", ERP id {result.get('erp_id')}" if result.get("erp_id") else "")
            + (f"\n{result.get('error')}" if result.get("error") else "")
        )
    if result["state"] != "Completed":
        raise typer.Exit(1)


@app.command("batch")
def batch(
    inventory: Inventory = DEFAULT_INVENTORY,
    store: Annotated[list[str] | None, typer.Option("--store", help="only these stores")] = None,
    canary: Annotated[int, typer.Option(help="stores in the canary wave")] = 1,
    wave_size: Annotated[int, typer.Option(help="stores per wave")] = 5,
    max_in_flight: Annotated[int, typer.Option(help="stores at once (fleet-wide)")] = 3,
    halt_threshold: Annotated[float, typer.Option(help="halt when failed/finished exceeds this")] = 0.2,
    stage_only: Annotated[
        bool,
        typer.Option(
            "--stage-only",
            help="only put the image on the batch's hypervisors (ahead of the "
            "rollout window; `stage-images` is the deployment)",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Roll out a batch in waves (canary first) with a progress bar per store."""
    if stage_only:
        stage(list(store or []), inventory, as_json)
        return
    import contextlib
    import sys

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from store_rollout.contracts import STEPS
    from store_rollout.inventory import load_inventory
    from store_rollout.steps import add_listener, remove_listener

    validate_stores(list(store or []), inventory)
    from flows.batch_rollout import batch_rollout

    ids = [s.store_id for s in load_inventory(inventory).select(list(store or []) or None)]
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[step]}"),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    )
    bars = {sid: progress.add_task(f"store {sid}", total=len(STEPS), step="queued") for sid in ids}

    def listen(sid: str, step: str, state: str, _s: float) -> None:
        if sid in bars:
            done = STEPS.index(step) + (1 if state == "done" else 0)
            progress.update(bars[sid], completed=done, step=f"{step} {state}")

    add_listener(listen)
    try:
        with progress, contextlib.redirect_stdout(sys.stderr):
            state = batch_rollout(
                str(inventory.resolve()),
                tuple(ids),
                canary,
                wave_size,
                max_in_flight,
                halt_threshold,
                return_state=True,
            )
    finally:
        remove_listener(listen)
    rows = state.result() if state.is_completed() else []
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        table = Table(title="batch")
        for col in ("store", "state", "step reached", "seconds", "error"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["store_id"], r["state"], r["step_reached"], str(r["seconds"]), r["error"][:80])
        Console(width=160).print(table)
    if not state.is_completed() or any(r["state"] != "Completed" for r in rows):
        raise typer.Exit(1)


@app.command("status")
def status(
    limit: Annotated[int, typer.Option(help="how many runs")] = 20,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Recent rollout, batch and rollback runs with their states."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=limit)
        flows = {f.id: f.name for f in client.read_flows()}
    rows = [
        {
            "name": r.name,
            "flow": flows.get(r.flow_id, "?"),
            "state": r.state.name if r.state else "?",
            "start": r.start_time.isoformat(timespec="seconds") if r.start_time else "-",
            "seconds": round(r.total_run_time.total_seconds(), 1),
        }
        for r in runs
    ]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="recent runs")
    for col in ("run", "flow", "state", "started", "seconds"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["name"]), str(r["flow"]), str(r["state"]), str(r["start"]), str(r["seconds"]))
    Console(width=160).print(table)


@app.command("prefect-setup")
def prefect_setup() -> None:
    """Make the Prefect server ready for rollouts (idempotent): the `cobbler-sync` limit and
    the automation that marks dead flow runs Crashed. Run it once per server (lab up does)."""
    from tasks.run_health import (
        AUTOMATION_NAME,
        HEARTBEAT_ENV,
        ZOMBIE_AFTER_SECONDS,
        ensure_zombie_automation,
    )
    from tasks.slots import COBBLER_SYNC_LIMIT, set_limit

    set_limit(COBBLER_SYNC_LIMIT, 1)
    console.print(f"global concurrency limit {COBBLER_SYNC_LIMIT}: 1 slot, active")
    console.print(f"automation {AUTOMATION_NAME!r}: {ensure_zombie_automation()} (a flow run "
                  f"without a heartbeat for {ZOMBIE_AFTER_SECONDS} s is marked Crashed)")
    env = " ".join(f"{k}={v}" for k, v in HEARTBEAT_ENV.items())
    console.print(f"start every worker with {env} in its environment (store-rollout's own "
                  "commands set it), or its runs send no heartbeats; and keep the server's "
                  "concurrency leases across restarts (docs/reliability.md)")


@app.command("rollback")
def rollback(store_id: str, inventory: Inventory = DEFAULT_INVENTORY) -> None:
    """Undo a store's rollout: VM destroyed and undefined, disk and VM key removed, netboot off."""
    from store_rollout.inventory import InventoryError, load_inventory
    from store_rollout.settings import load_settings

    try:
        load_inventory(inventory).get(store_id)
        load_settings()  # refused here, not as a failed flow run once the rollback has begun
    except InventoryError as exc:
        refuse(str(exc))
    except SettingsError as exc:
        refuse_settings(exc)
    from flows.store_rollback import store_rollback

    state = store_rollback(store_id, str(inventory.resolve()), return_state=True)
    if not state.is_completed():
        console.print(f"[red]rollback of {store_id} {state.name}:[/] {state.message}")
        raise typer.Exit(1)
    print(json.dumps(state.result(), indent=2, default=str))


@app.command("plan")
def plan(
    store_ids: Annotated[list[str], typer.Argument(help="stores to plan")],
    inventory: Inventory = DEFAULT_INVENTORY,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    highstate_test: Annotated[bool, typer.Option(
        help="run each answering hypervisor's highstate in test=True")] = True,
) -> None:
    """What a rollout of each store would do now, step by step; changes nothing."""
    validate_stores(store_ids, inventory)
    from flows.plan import store_plan

    result = finished(store_plan(store_ids, str(inventory.resolve()), highstate_test,
                                 return_state=True), "plan")
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    out = Console(width=160)
    for sid, store in result.items():
        todo = store["todo"]
        table = Table(title=f"store {sid}: " + (f"{len(todo)} steps to do, from "
                                                f"{store['resumes_at']}" if todo else
                                                "nothing to do"), show_lines=True)
        for col in ("step", "to do", "action", "details"):
            table.add_column(col)
        for step in store["steps"]:
            table.add_row(step["step"], "[yellow]yes[/]" if step["todo"] else "no",
                          step["action"], "\n".join(step["details"]))
        out.print(table)


@app.command("reconcile")
def reconcile(
    store_ids: Annotated[list[str] | None, typer.Argument(
        help="stores to check (default: every store of the inventory)")] = None,
    inventory: Inventory = DEFAULT_INVENTORY,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Every store's real state against its last rollout run; each mismatch with its fix.
    Exits 1 when any store has a mismatch."""
    validate_stores(store_ids or [], inventory)
    from flows.reconcile import store_reconcile

    result = finished(store_reconcile(str(inventory.resolve()), store_ids or None,
                                      return_state=True), "reconcile", code=2)
    stores = result["stores"]
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        table = Table(title="reconcile: " + ", ".join(
            f"{n} {status}" for status, n in sorted(result["counts"].items())), show_lines=True)
        for col in ("store", "status", "last run", "systems", "mismatch → fix"):
            table.add_column(col)
        for sid, s in stores.items():
            table.add_row(sid, s["status"], s["last_run"], s["real"], "\n".join(
                f"{m['what']} → {m['fix']}" for m in s["mismatches"]))
        Console(width=180).print(table)
    if any(s["mismatches"] for s in stores.values()):
        raise typer.Exit(1)


@app.command("stage")
def stage(
    store_ids: Annotated[
        list[str] | None, typer.Argument(help="stores to stage (default: every store of the inventory)")
    ] = None,
    inventory: Inventory = DEFAULT_INVENTORY,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Put the base image on the stores' hypervisors ahead of the rollout window."""
    validate_stores(store_ids or [], inventory)
    from flows.stage_images import stage_images

    result = finished(stage_images(tuple(store_ids or ()), str(inventory), return_state=True),
                      "staging")
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    for sid, staged in result["stores"].items():
        console.print(
            f"store {sid}: image {result['image_key'][:12]} on {staged['hypervisor']}: "
            + (
                "already there"
                if staged["cached"]
                else f"{staged['transferred']} bytes in {staged['seconds']}s"
            )
        )


@app.command("vm-xml")
def vm_xml(
    store_id: str,
    inventory: Inventory = DEFAULT_INVENTORY,
    hypervisor: Annotated[
        str, typer.Option("--hypervisor", help="hypervisor type: xen (production) or kvm")
    ] = "xen",
    images_dir: Annotated[
        str | None,
        typer.Option(
            "--images-dir", help="the hypervisor's VM images dir (default: the vm_images_dir setting)"
        ),
    ] = None,
) -> None:
    """Print the domain XML step 5 would define for a store (virt.init's own generator)."""
    from store_rollout.inventory import InventoryError, load_inventory
    from store_rollout.settings import RolloutSettings, load_settings
    from tasks.virt import DEVICE_MODELS, domain_xml

    if hypervisor not in DEVICE_MODELS:
        console.print(
            f"[red]error:[/] --hypervisor {hypervisor!r}: choose one of {', '.join(sorted(DEVICE_MODELS))}"
        )
        raise typer.Exit(2)
    try:
        store = load_inventory(inventory).select([store_id])[0]
    except InventoryError as exc:
        refuse(str(exc))
    if images_dir is None:
        try:
            images_dir = load_settings().vm_images_dir
        except SettingsError:
            images_dir = str(RolloutSettings.model_fields["vm_images_dir"].default)
            console.print(
                f"note: settings not loadable here; images dir {images_dir} (pass --images-dir to choose)"
            )
    print(domain_xml(store, hypervisor, images_dir))


@app.command("serve")
def serve(
    deployment: Annotated[list[str] | None, typer.Option(
        "--deployment", "-d", help="only these deployments of prefect.yaml")] = None,
    limit: Annotated[int, typer.Option(help="flow runs at once in this process")] = 10,
    list_only: Annotated[bool, typer.Option(
        "--list", help="print what would be served as JSON and exit")] = False,
) -> None:
    """Serve prefect.yaml's deployments from this process: the single-host alternative to a work
    pool and `prefect worker start` (same names, parameters, schedules and tags)."""
    from app.deployments import DeploymentConfigError, runner_deployments

    try:
        served = runner_deployments(deployment or None)
    except DeploymentConfigError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    if list_only:
        print(json.dumps([{
            "name": d.name, "entrypoint": d.entrypoint, "description": d.description,
            "parameters": d.parameters, "tags": d.tags,
            "schedules": [{"cron": getattr(s.schedule, "cron", None),
                           "timezone": getattr(s.schedule, "timezone", None), "active": s.active}
                          for s in d.schedules or []]} for d in served], indent=2))
        return
    from prefect import serve as prefect_serve

    prefect_serve(*served, limit=limit)


def _registered_commands() -> None:
    for entry in entry_points(group=COMMAND_GROUP):
        app.add_typer(entry.load(), name=entry.name)


_registered_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
