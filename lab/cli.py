"""`store-rollout lab ...`: the local lab (real services, simulated hardware) and its demo.

Registered as a sub-command of the application's CLI through the entry point group
`store_rollout.commands` by the lab's own distribution (lab/pyproject.toml, which `make setup`
installs), with `settings_hint` in `store_rollout.settings_hints`: the application never
imports the lab, and loads this module only for `store-rollout lab ...` (app/commands.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from lab.manager import Lab
from lab.state import LabInfo, LabPaths, load_lab_info, running_labs, state_dir_from_env
from lab.store_network import BRIDGE
from store_rollout.inventory import DEFAULT_INVENTORY
from store_rollout.settings import SETTINGS_FILE_ENV

lab_app = typer.Typer(no_args_is_help=True, help="The local lab (real services, simulated hardware).")
console = Console(stderr=True)

StateDir = Annotated[Path | None, typer.Option("--state-dir", help="lab state dir (default .lab/)")]
Inventory = Annotated[Path, typer.Option("--inventory", "-i", help="inventory YAML or CSV")]


def settings_hint(missing: tuple[str, ...]) -> list[str]:
    """The application CLI asks a command plugin what to add to a settings error: with settings
    missing and no settings file named, the line that names a lab running on this machine."""
    labs = running_labs() if missing and not os.environ.get(SETTINGS_FILE_ENV) else []
    if not labs:
        return []
    files = [LabPaths(lab).settings_file for lab in labs]
    return [f"export {SETTINGS_FILE_ENV}={files[0]}  # the lab running on this machine"
            + (f" (also running: {', '.join(map(str, files[1:]))})" if files[1:] else "")]


def _mib(value: int) -> str:
    return f"{value / 2**20:.0f} MiB"


@lab_app.command("up")
def lab_up(
    state_dir: StateDir = None,
    full: Annotated[bool | None, typer.Option(
        "--full/--simulated-guest",
        help="store VMs boot the real KIWI-built image under QEMU and run their own firstboot "
             "(default: as this lab was; a new lab simulates the guest)")] = None,
    regions: Annotated[int | None, typer.Option(
        "--regions", min=1, max=2,
        help="2: a second region (r2) with its own Salt master and worker on work pool "
             "rollout-r2 (default: as this lab was; a new lab has one)")] = None,
) -> None:
    """Start (or repair) the lab; prints where lab.json is."""
    lab = Lab.at(state_dir)
    try:
        info = lab.up(progress=lambda m: console.print(f"[dim]lab:[/] {m}"), full=full,
                      regions=regions)
    except Exception as exc:
        console.print(f"[red]lab up failed:[/] {exc}\nlogs: {lab.paths.logs}")
        raise typer.Exit(1) from exc
    if info.full:
        console.print(f"full lab: store VMs boot the image ({info.vm_type}); store inventory "
                      f"entries need vm.network {BRIDGE} for the guest to reach the master")
    if info.regions == 2:
        console.print(f"two regions (regions file {info.regions_file}): default, and r2 with "
                      f"its own Salt master ({info.region2_salt_master_config}) and worker; "
                      "inventory entries of r2's stores need `region: r2`")
    console.print(
        f"lab ready: {lab.paths.lab_json}\n"
        "to run rollouts against it (the CLI never picks a lab by itself):\n"
        f"  export {SETTINGS_FILE_ENV}={lab.paths.settings_file}\n"
        f"Prefect UI: {info.prefect_ui_url} (its login: the line in {info.prefect_auth_file}; "
        f"a browser trusts the lab CA {info.prefect_ca_file} once imported)"
    )


@lab_app.command("status")
def lab_status(state_dir: StateDir = None, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Each service, its address, PID and RSS (process tree)."""
    lab = Lab.at(state_dir)
    rows = lab.status()
    minions = lab.minion_rows()
    total = sum(r["rss_bytes"] for r in rows)
    info = lab.paths.load_info()
    hosts = _racked(info) if rows and all(r["alive"] for r in rows) else []
    if as_json:
        print(json.dumps({"services": rows, "minions": minions, "hosts": hosts,
                          "total_rss_bytes": total}, indent=2))
        return
    table = Table(title=f"lab at {lab.paths.root}")
    for col in ("service", "address", "pid", "state", "rss"):
        table.add_column(col)
    for r in [*rows, *minions]:
        table.add_row(
            r["service"],
            r["address"],
            str(r["pid"]),
            "running" if r["alive"] else "[red]dead[/]",
            _mib(r["rss_bytes"]),
        )
    table.add_row("total (services)", "", "", "", _mib(total))
    Console().print(table)
    if hosts:
        racked = Table(title="racked store hosts (libvirt domains behind their BMCs)")
        for col in ("host", "store", "MAC", "BMC", "power"):
            racked.add_column(col)
        for h in hosts:
            bmc = (f"IPMI 127.0.0.1:{h['ipmi_port']}" if h["ipmi_port"] else
                   f"Redfish {info.redfish_url if info else ''} system {h['system']}")
            racked.add_row(h["system"], h["store_id"], h["mac"], bmc, "on" if h["on"] else "off")
        Console().print(racked)
    if info is not None:
        Console().print(f"Prefect UI: {info.prefect_ui_url} (login: the line in "
                        f"{info.prefect_auth_file})")
    if rows and not all(r["alive"] for r in rows):
        raise typer.Exit(1)


@lab_app.command("down")
def lab_down(
    state_dir: StateDir = None, purge: Annotated[bool, typer.Option(help="also delete the state dir")] = False
) -> None:
    """Stop everything the lab started (by PID / process group)."""
    Lab.at(state_dir).down(purge=purge)
    console.print("lab down")


@lab_app.command("demo")
def demo(inventory: Inventory = Path(DEFAULT_INVENTORY), state_dir: StateDir = None) -> None:
    """Roll out every store of the inventory concurrently in the lab and print a summary."""
    # the demo is the lab's by definition: it names the lab itself
    lab_dir = state_dir_from_env(state_dir)
    os.environ[SETTINGS_FILE_ENV] = str(LabPaths(lab_dir).settings_file)
    from prefect.settings import PREFECT_HOME, temporary_settings

    from lab.prefect_access import PrefectAccess

    # the lab's API over TLS, logged in with the lab's credential
    with PrefectAccess.of(load_lab_info(lab_dir)).settings(), \
            temporary_settings(updates={PREFECT_HOME: lab_dir / "prefect-client-home"}):
        _demo(_racked_copy(inventory, lab_dir))


@lab_app.command("approver-code")
def approver_code(name: Annotated[str, typer.Argument(help="a lab approver (ana or ben)")],
                  state_dir: StateDir = None) -> None:
    """Print a one-time code of a lab approver, for `--approver NAME --code CODE` or the
    approval form on a run's page (the lab's stand-in for the approver's authenticator)."""
    from lab.approvers import LAB_APPROVERS, approver_code

    if name not in LAB_APPROVERS:
        console.print(f"[red]error:[/] {name!r} is not a lab approver: use one of "
                      f"{', '.join(LAB_APPROVERS)}")
        raise typer.Exit(2)
    info = load_lab_info(state_dir_from_env(state_dir))
    print(approver_code(info, name))


@lab_app.command("rack")
def rack(inventory: Annotated[Path, typer.Argument(help="inventory file (YAML)", exists=True,
                                                    dir_okay=False)],
         state_dir: StateDir = None,
         own_libvirt: Annotated[bool, typer.Option(
             "--own-libvirt", help="each host runs a libvirtd of its own while its OS is up "
             "(TLS on its address, its own VM images and PKI: a refresh's migration between "
             "two boxes), instead of driving the lab's shared libvirtd")] = False,
         link: Annotated[str | None, typer.Option(
             help="every racked store's WAN link profile (lan, dsl, lte, satellite: "
             "`lab link`)")] = None) -> None:
    """Rack the inventory's store hosts in the lab (a domain and its IPMI or Redfish BMC each)
    and write a copy of the inventory with their BMC fields into the lab's state dir."""
    lab_dir = state_dir_from_env(state_dir)
    console.print(str(_racked_copy(inventory, lab_dir, own_libvirt)))
    if link is not None:
        import yaml

        for entry in yaml.safe_load(inventory.read_text())["stores"]:
            _set_link(load_lab_info(lab_dir), str(entry["store_id"]), link)


@lab_app.command("link")
def link(store_id: Annotated[str, typer.Argument(help="the store whose WAN link to show or set")],
         state_dir: StateDir = None,
         profile: Annotated[str | None, typer.Option(
             help="lan (no shaping), dsl, lte or satellite")] = None,
         cut: Annotated[bool, typer.Option("--cut", help="cut the link (a fault knob): "
                                           "everything dropped both ways, silently")] = False,
         restore: Annotated[bool, typer.Option("--restore", help="bring a cut link back")] = False,
         ) -> None:
    """Show or set a store's WAN link in the lab: its profile (rate, delay, loss), or cut it and
    restore it (lab/wan.py; docs/lab.md, "Store links")."""
    from lab import wan

    info = load_lab_info(state_dir_from_env(state_dir))
    if cut and restore:
        console.print("[red]error:[/] --cut and --restore: give one")
        raise typer.Exit(2)
    if profile is not None:
        _set_link(info, store_id, profile)
    state = (wan.cut_store_link(info, store_id) if cut else wan.restore_store_link(info, store_id)
             if restore else wan.store_link(info, store_id))
    print(f"store {store_id}: {wan.describe(state)}")


def _set_link(info: LabInfo, store_id: str, profile: str) -> None:
    from lab import wan

    if profile not in wan.PROFILES:
        console.print(f"[red]error:[/] --link/--profile {profile!r}: use one of "
                      f"{', '.join(wan.PROFILES)}")
        raise typer.Exit(2)
    wan.set_store_link(info, store_id, profile)


def _racked(info: LabInfo | None) -> list[dict[str, Any]]:
    from lab.hardware import racked_hosts

    return racked_hosts(info) if info is not None else []


def _racked_copy(inventory: Path, lab_dir: Path, own_libvirt: bool = False) -> Path:
    import shutil

    from lab.hardware import rack_inventory

    copy = lab_dir / f"racked-{inventory.name}"
    shutil.copyfile(inventory, copy)
    for host in rack_inventory(load_lab_info(lab_dir), copy, own_libvirt=own_libvirt):
        console.print(f"racked {host.system}: {host.power_type} BMC {host.power_address}"
                      + (f" port {host.power_port}" if host.power_port else "")
                      + (", its own libvirtd" if own_libvirt else ""))
    return copy


def _demo(inventory: Path) -> None:
    from app.runner import run_stores, validate_stores
    from store_rollout.contracts import STEPS
    from store_rollout.inventory import load_inventory

    validate_stores([], inventory)
    stores = load_inventory(inventory).stores
    # a demo is run when its user is there, not in the stores' maintenance windows: it
    # overrides them as `rollout --now` does, and says so (each result's window_overridden)
    console.print("demo: the stores' maintenance windows are overridden (rollout --now); "
                  "`store-rollout windows` lists them")
    results = run_stores([s.store_id for s in stores], inventory, live=True, ignore_windows=True)
    table = Table(title="demo summary (seconds per step)")
    for col in ["store", "platform", "state", *[s.replace("_", " ") for s in STEPS], "total",
                "ERP id"]:
        table.add_column(col)
    platforms = {s.store_id: s.hypervisor.platform or "(chain default)" for s in stores}
    for r in results:
        step_seconds = r.get("step_seconds") or {}
        assert isinstance(step_seconds, dict)
        table.add_row(
            str(r["store_id"]), platforms.get(str(r["store_id"]), "-"),
            str(r["state"]),
            *[f"{step_seconds[s]:.1f}" if s in step_seconds else "-" for s in STEPS],
            str(r["seconds"]),
            str(r.get("erp_id", "-")),
        )
    Console(width=200).print(table)
    from prefect.settings import PREFECT_API_URL

    Console().print(f"Prefect UI: {str(PREFECT_API_URL.value()).removesuffix('/api')}")
    if any(r["state"] != "Completed" for r in results):
        raise typer.Exit(1)
