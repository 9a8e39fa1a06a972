"""`store-rollout` command line; replace, refresh, update, revert and backup live in
app/replace.py, app/refresh.py, app/image_update.py and app/backup.py, how commands run flows
in app/runner.py, what they show in app/live.py and app/views.py; other installs'
sub-commands load only when run (app/commands.py)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console

from app.audit import audit_app
from app.commands import PluginGroup
from app.image_update import IMAGE_COMMANDS
from app.offline import INVENTORY, Confirmed, Inventory, Now, RequiredInventory, vm_xml, windows
from app.refresh import BOX_COMMANDS
from app.runner import (
    command_prefect_settings,
    console,
    finished,
    recent_runs,
    refuse_settings,
    run_batch,
    run_stores,
    servers_answer,
    validate_stores,
)
from app.setup import prefect_setup
from app.undo import Approver, Code, NoExport, run_store_undo
from app.views import print_batch, print_plan, print_reconcile, print_runs, print_staged
from store_rollout.settings import SettingsError
from store_rollout.step_timeouts import STEP_TIMEOUTS, StepTimeouts

app = typer.Typer(
    cls=PluginGroup,
    no_args_is_help=True,
    add_completion=False,
    help="Roll out retail stores: KIWI image, Cobbler PXE, Salt, libvirt, ERP.",
)


@app.callback()
def _prefect_of_the_settings_file(ctx: typer.Context) -> None:
    """With STORE_ROLLOUT_SETTINGS_FILE (and no PREFECT_API_URL), every command talks to the
    Prefect server that file names: set as Prefect settings for the command's duration, whatever
    was imported before."""
    try:  # the Prefect credential's file, when named, is read here
        ctx.with_resource(command_prefect_settings())
    except SettingsError as exc:
        refuse_settings(exc)


# commands that only read the inventory (and settings) and print
app.command("vm-xml")(vm_xml)
app.command("windows")(windows)
for name, command in (*BOX_COMMANDS, *IMAGE_COMMANDS):
    app.command(name)(command)
app.command("prefect-setup")(prefect_setup)
app.add_typer(audit_app, name="audit")


def timeout_option(name: str) -> Any:
    """A step timeout's option, its help the StepTimeouts field's description."""
    return typer.Option(help=StepTimeouts.model_fields[name].description)


@app.command("rollout")
def rollout(
    store_id: str,
    inventory: RequiredInventory,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    hypervisor_timeout: Annotated[float, timeout_option("hypervisor_timeout")] = (
        STEP_TIMEOUTS.hypervisor_timeout),
    firstboot_timeout: Annotated[float, timeout_option("firstboot_timeout")] = (
        STEP_TIMEOUTS.firstboot_timeout),
    vm_stall_timeout: Annotated[float, timeout_option("vm_stall_timeout")] = (
        STEP_TIMEOUTS.vm_stall_timeout),
    hypervisor_stall_timeout: Annotated[float, timeout_option("hypervisor_stall_timeout")] = (
        STEP_TIMEOUTS.hypervisor_stall_timeout),
    vm_contact_timeout: Annotated[float, timeout_option("vm_contact_timeout")] = (
        STEP_TIMEOUTS.vm_contact_timeout),
    now: Annotated[bool, typer.Option(
        "--now", help="emergency: start disruptive steps outside the store's maintenance "
                      "windows (the run says so)")] = False,
    recreate_vm: Annotated[bool, typer.Option(
        "--recreate-vm", help="remove the store's VM and create it anew on the current image "
                              "(asks for an approval on the run's page first, as the "
                              "approval_policy setting says)")] = False,
    reinstall_hypervisor: Annotated[bool, typer.Option(
        "--reinstall-hypervisor", help="reinstall the store's host even though it is installed "
                                       "and ready, wiping its disk and the store server on it "
                                       "(approved first, like --recreate-vm)")] = False,
) -> None:
    """Roll out one store (one Prefect flow run) with a live view of its steps."""
    validate_stores([store_id], inventory)
    result = run_stores(
        [store_id], inventory, live=not as_json, hypervisor_timeout=hypervisor_timeout,
        firstboot_timeout=firstboot_timeout, vm_stall_timeout=vm_stall_timeout,
        hypervisor_stall_timeout=hypervisor_stall_timeout, vm_contact_timeout=vm_contact_timeout,
        ignore_windows=now, recreate_vm=recreate_vm, reinstall_hypervisor=reinstall_hypervisor,
    )[0]
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:  # the result on stdout; logs and the live view on stderr
        Console(soft_wrap=True).print(
            f"store {store_id}: {result['state']} in {result['seconds']}s"
            + (f", ERP id {result.get('erp_id')}" if result.get("erp_id") else "")
            + (f"\n{result.get('error')}" if result.get("error") else "")
        )
    if result["state"] != "Completed":
        raise typer.Exit(1)


@app.command("batch")
def batch(
    inventory: RequiredInventory,
    store: Annotated[list[str] | None, typer.Option("--store", help="only these stores")] = None,
    canary: Annotated[int, typer.Option(help="stores in the canary wave")] = 1,
    wave_size: Annotated[int, typer.Option(help="stores per wave")] = 5,
    max_in_flight: Annotated[int, typer.Option(help="stores at once (fleet-wide)")] = 3,
    max_in_flight_per_region: Annotated[int, typer.Option(
        help="stores at once in each region (0: as --max-in-flight)")] = 0,
    halt_threshold: Annotated[float, typer.Option(help="halt when failed/finished exceeds this")] = 0.2,
    stage_only: Annotated[bool, typer.Option("--stage-only", help=(
        "only put the image on the batch's hypervisors (ahead of the rollout window; "
        "`stage-images` is the deployment)"))] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    now: Annotated[bool, typer.Option("--now", help=(
        "emergency: every store starts now, its disruptive steps outside its maintenance "
        "windows"))] = False,
    rerun_completed: Annotated[bool, typer.Option("--rerun-completed", help=(
        "roll out again the stores whose newest rollout run completed (left as they are "
        "otherwise)"))] = False,
    image: Annotated[str | None, typer.Option("--image", help="update the stores to this image "
                     "version instead, each in its window ('': its own); --stage-only: stage it")] = None,
) -> None:
    """Roll out a batch in waves (canary first) with a progress bar per store. Stores with a
    calendar are scheduled into their maintenance windows instead: each is a run of the
    store-rollout deployment, Scheduled for its window's start, which a worker runs. In a
    chain of regions each store is a run of its region's deployment, on its region's worker,
    and each region waves and halts on its own."""
    if stage_only:
        stage(list(store or []), inventory=inventory, as_json=as_json, image=image or "")
        return
    validate_stores(list(store or []), inventory, dispatched=True)
    state = run_batch(inventory, list(store or []), show_progress=not as_json, canary=canary,
                      wave_size=wave_size, max_in_flight=max_in_flight,
                      max_in_flight_per_region=max_in_flight_per_region,
                      halt_failure_ratio=halt_threshold, ignore_windows=now,
                      rerun_completed=rerun_completed, action="rollout" if image is None
                      else "update", image_version=image or "")
    rows = state.result() if state.is_completed() else []
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
    else:
        print_batch(rows)
    if not state.is_completed() or any(r["state"] != "Completed" for r in rows):
        raise typer.Exit(1)


@app.command("status")
def status(
    limit: Annotated[int, typer.Option(help="how many runs")] = 20,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Recent rollout, batch and rollback runs with their states (past and running first,
    then the upcoming ones, a batch's stores scheduled into their windows)."""
    rows = recent_runs(limit)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    print_runs(rows)


@app.command("rollback")
def rollback(store_id: str, inventory: RequiredInventory, yes: Confirmed = False,
             now: Now = False, approver: Approver = "", code: Code = "") -> None:
    """Undo a store's rollout: VM destroyed and undefined, system disk and VM key removed (its
    data disk kept), netboot off. Shows what it will do; `--yes --approver NAME --code CODE`
    goes on (in its window, `--now`)."""
    print(json.dumps(run_store_undo("rollback", store_id, inventory, yes, now, approver, code),
                     indent=2, default=str))


@app.command("decommission")
def decommission(store_id: str, inventory: RequiredInventory, yes: Confirmed = False,
                 now: Now = False, approver: Approver = "", code: Code = "",
                 no_export: NoExport = False) -> None:
    """Close a store: VM and disks removed (an export of its data disk kept first, unless
    --no-export), host and VM keys deleted, Cobbler record removed, host powered off, the ERP
    told. A rerun finishes what a failed run left. Shows what it will do; `--yes --approver
    NAME --code CODE` goes on (in the store's maintenance window, or `--now`)."""
    print(json.dumps(run_store_undo("decommission", store_id, inventory, yes, now, approver,
                                    code, keep_export=not no_export), indent=2, default=str))


@app.command("plan")
def plan(
    store_ids: Annotated[list[str], typer.Argument(help="stores to plan")],
    inventory: Inventory = INVENTORY,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    highstate_test: Annotated[bool, typer.Option(
        help="run each answering hypervisor's highstate in test=True")] = True,
    recreate_vm: Annotated[bool, typer.Option(
        "--recreate-vm", help="plan a rollout that recreates the stores' VMs")] = False,
    reinstall_hypervisor: Annotated[bool, typer.Option(
        "--reinstall-hypervisor", help="plan a rollout that reinstalls the stores' hosts")] = False,
    replace_mac: Annotated[str | None, typer.Option(
        "--replace-mac", help="plan `replace` of the one store given onto this MAC's box")] = None,
) -> None:
    """What a rollout of each store would do now, step by step; changes nothing."""
    validate_stores(store_ids, inventory, dispatched=True)
    from flows.plan import store_plan

    box = {"mac": replace_mac} if replace_mac else None
    result = finished(store_plan(store_ids, str(inventory.resolve()), highstate_test, recreate_vm,
                                 reinstall_hypervisor, box, return_state=True), "plan")
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    print_plan(result)


@app.command("reconcile")
def reconcile(
    store_ids: Annotated[list[str] | None, typer.Argument(
        help="stores to check (default: every store of the inventory)")] = None,
    inventory: Inventory = INVENTORY,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Every store's real state against its last rollout run; each mismatch with its fix.
    Exits 1 when any store has a mismatch."""
    validate_stores(store_ids or [], inventory, dispatched=True)
    from flows.reconcile import store_reconcile

    result = finished(store_reconcile(str(inventory.resolve()), store_ids or None,
                                      return_state=True), "reconcile", code=2)
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print_reconcile(result)
    if any(s["mismatches"] for s in result["stores"].values()):
        raise typer.Exit(1)


@app.command("stage")
def stage(
    store_ids: Annotated[list[str] | None, typer.Argument(
        help="stores to stage (default: every store of the inventory)")] = None,
    *, inventory: RequiredInventory,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    image: Annotated[str, typer.Option("--image", help="this version (an upcoming update) "
                                       "instead of each store's own")] = "",
) -> None:
    """Put each store's base image on its hypervisor ahead of its rollout or update window."""
    validate_stores(store_ids or [], inventory)
    from flows.stage_images import stage_images

    result = finished(stage_images(str(inventory), tuple(store_ids or ()), image,
                                   return_state=True), "staging")
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    print_staged(result)


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
    from app.deployments import DeploymentConfigError, runner_deployments, served_as_json

    try:
        served = runner_deployments(deployment or None)
    except DeploymentConfigError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    if list_only:
        print(json.dumps([served_as_json(d) for d in served], indent=2))
        return
    from prefect import serve as prefect_serve

    prefect_serve(*served, limit=limit)


def main() -> None:
    with servers_answer():
        app()


if __name__ == "__main__":
    main()
