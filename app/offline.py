"""Commands that only read the inventory (and settings) and print, touching no system:
`vm-xml` (the domain XML step 5 would define) and `windows` (each store's maintenance windows)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated
from zoneinfo import ZoneInfo

import typer
from rich.console import Console
from rich.table import Table

from app.runner import console, refuse
from store_rollout.calendar import HORIZON
from store_rollout.inventory import DEFAULT_INVENTORY
from store_rollout.inventory.calendar_spec import skipped_windows
from store_rollout.settings import SettingsError, load_settings

Inventory = Annotated[Path, typer.Option("--inventory", "-i", help="inventory YAML or CSV")]
# commands that only read may fall back on the example; a command that changes anything
# names its inventory (typer refuses it without: "Missing option '--inventory'")
INVENTORY = Path(DEFAULT_INVENTORY)
RequiredInventory = Annotated[Path, typer.Option(
    "--inventory", "-i", help="inventory YAML or CSV (required: this command changes stores)")]
Confirmed = Annotated[bool, typer.Option(
    "--yes", help="go on: without it the command shows what it would do and stops")]
Now = Annotated[bool, typer.Option(
    "--now", help="emergency: go on outside the store's maintenance windows (logged)")]


def vm_xml(
    store_id: str,
    inventory: Inventory = INVENTORY,
    hypervisor: Annotated[str, typer.Option(
        "--hypervisor", help="hypervisor type: xen (production) or kvm")] = "xen",
    images_dir: Annotated[str | None, typer.Option(
        "--images-dir", help="the hypervisor's VM images dir (default: the vm_images_dir setting)")
    ] = None,
) -> None:
    """Print the domain XML step 5 would define for a store (virt.init's own generator)."""
    from store_rollout.inventory import InventoryError, load_inventory
    from store_rollout.settings import RolloutSettings, load_settings
    from tasks.vm_domain import DEVICE_MODELS, domain_xml

    if hypervisor not in DEVICE_MODELS:
        refuse(f"--hypervisor {hypervisor!r}: choose one of {', '.join(sorted(DEVICE_MODELS))}")
    try:
        store = load_inventory(inventory).select([store_id])[0]
    except InventoryError as exc:
        refuse(str(exc))
    if images_dir is None:
        try:
            images_dir = load_settings().vm_images_dir
        except SettingsError:
            images_dir = str(RolloutSettings.model_fields["vm_images_dir"].default)
            console.print(f"note: settings not loadable here; images dir {images_dir} (pass "
                          "--images-dir to choose)")
    print(domain_xml(store, hypervisor, images_dir))


def windows(
    store_ids: Annotated[list[str] | None, typer.Argument(help="stores (default: every store)")] = None,
    inventory: Inventory = INVENTORY,
    count: Annotated[int, typer.Option(min=1, max=50, help="windows per store")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="print them as JSON")] = False,
) -> None:
    """Each store's next maintenance windows (the one open now first), in the store's local time
    and in UTC, from the inventory's calendars; blackout dates taken out."""
    from store_rollout.inventory import InventoryError, load_inventory

    try:
        stores = load_inventory(inventory).select(store_ids)
    except InventoryError as exc:
        refuse(str(exc))
    now = datetime.now(UTC)
    try:
        default = load_settings().default_calendar
    except SettingsError:  # no settings here: stores without a calendar show none
        default = None
    calendars = {s.store_id: s.calendar or default for s in stores}
    found = {sid: None if spec is None else spec.next_windows(now, count)
             for sid, spec in calendars.items()}
    skipped = {sid: [] if spec is None else skipped_windows(
        spec, now, max((w.end for w in found[sid] or []), default=now + HORIZON))
        for sid, spec in calendars.items()}
    if as_json:
        print(json.dumps({sid: None if ws is None else {
            "windows": [w.as_dict(now) for w in ws],
            "skipped_0h": [{"start_utc": at.isoformat(), "window": text}
                           for at, text in skipped[sid]]} for sid, ws in found.items()},
            indent=2))
        return
    table = Table(title=f"maintenance windows ({now:%Y-%m-%d %H:%M} UTC now)")
    for col in ("store", "time zone", "local", "UTC", "hours", ""):
        table.add_column(col)
    for store in stores:
        rows = found[store.store_id]
        spec = calendars[store.store_id]
        if rows is None:
            table.add_row(store.store_id, "-", "none: no calendar and no default one "
                          "(disruptive steps refused)", "", "", "")
        elif not rows:
            table.add_row(store.store_id, str(spec and spec.time_zone),
                          f"none within {HORIZON.days} days (blackout dates?)", "", "", "")
        for n, w in enumerate(rows or []):
            start, end = w.local(w.start), w.local(w.end)
            table.add_row(store.store_id if n == 0 else "", w.time_zone if n == 0 else "",
                          f"{start:%a %Y-%m-%d %H:%M} - {end:%a %H:%M %Z}",
                          f"{w.start:%a %m-%d %H:%M} - {w.end:%a %H:%M}", f"{w.hours:g}",
                          "open now" if w.contains(now) else "")
        for at, text in skipped[store.store_id]:
            local = at.astimezone(ZoneInfo(str(spec and spec.time_zone)))
            table.add_row("", "", f"{local:%a %Y-%m-%d}: {text}", f"{at:%a %m-%d %H:%M}", "0",
                          "skipped: the clocks go forward in it")
    Console(width=160).print(table)
