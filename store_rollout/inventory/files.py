"""Reading an inventory: a YAML file, or a CSV export of the ERP (',', ';' or tab separated),
into the validated model; every error names the file, the store, the field and the fix."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import ValidationError

from store_rollout.inventory.models import Inventory, InventoryError

# what every command, flow and deployment reads unless given another file (relative: from the
# store-rollout checkout the command or worker runs in)
DEFAULT_INVENTORY: Final = "examples/inventory.yaml"


def _describe(exc: ValidationError, raw: dict[str, Any], source: str) -> InventoryError:
    lines = []
    stores = raw.get("stores") if isinstance(raw, dict) else None
    for err in exc.errors():
        loc = list(err["loc"])
        where = ""
        if len(loc) >= 2 and loc[0] == "stores" and isinstance(loc[1], int) and stores:
            sid = stores[loc[1]].get("store_id", "?") if isinstance(stores[loc[1]], dict) else "?"
            where = f"store {sid!r}: "
            loc = loc[2:]
        field = ".".join(str(p) for p in loc) or "inventory"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "missing: add this field"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field: remove it or check its spelling"
        elif err["type"] == "string_pattern_mismatch" and field.endswith("store_id"):
            msg = (f"invalid store_id {err.get('input')!r}: lowercase letters, digits and '-', "
                   "at most 24 characters")
        lines.append(f"{where}{field}: {msg}")
    return InventoryError(f"{source}: " + "; ".join(lines))


def parse_inventory(raw: Any, source: str = "inventory") -> Inventory:
    if not isinstance(raw, dict) or not isinstance(raw.get("stores"), list):
        raise InventoryError(f"{source}: expected a mapping with a 'stores:' list")
    try:
        inventory = Inventory.model_validate(raw)
    except ValidationError as exc:
        raise _describe(exc, raw, source) from None
    inventory._source = source
    return inventory


CSV_COLUMNS = {
    "store_id": ("store_id",), "region": ("region",), "hv_hostname": ("hypervisor", "hostname"),
    "hv_mac": ("hypervisor", "mac"), "hv_ip": ("hypervisor", "ip"),
    "hv_netmask": ("hypervisor", "netmask"), "hv_gateway": ("hypervisor", "gateway"),
    "hv_platform": ("hypervisor", "platform"), "hv_dom0_mem": ("hypervisor", "dom0_mem"),
    "cobbler_profile": ("hypervisor", "cobbler_profile"),
    "hv_power_type": ("hypervisor", "power_type"), "hv_power_address": ("hypervisor", "power_address"),
    "hv_power_port": ("hypervisor", "power_port"),
    "hv_redfish_system_id": ("hypervisor", "redfish_system_id"),
    "hv_bmc_credentials_block": ("hypervisor", "bmc_credentials_block"),
    "hv_ipmi_cipher_suite": ("hypervisor", "ipmi_cipher_suite"),
    "hv_serial": ("hypervisor", "serial"),
    "hypervisor_minion_id": ("hypervisor", "minion_id"),
    "vm_name": ("vm", "name"), "vm_vcpus": ("vm", "vcpus"), "vm_memory_mib": ("vm", "memory_mib"),
    "vm_disk_gib": ("vm", "disk_gib"), "vm_data_disk_gib": ("vm", "data_disk_gib"),
    "vm_image_version": ("vm", "image_version"), "vm_network": ("vm", "network"),
    "erp_site_code": ("erp", "site_code"), "erp_cost_center": ("erp", "cost_center"),
    "time_zone": ("calendar", "time_zone"), "maintenance_windows": ("calendar", "windows"),
    "blackout_dates": ("calendar", "blackout"),
}
# columns that hold a list: its entries separated by ";" in the cell (a spreadsheet quotes a
# cell that holds its delimiter)
CSV_LIST_COLUMNS = {"maintenance_windows", "blackout_dates"}


# a spreadsheet saves ',' or, where ',' is the decimal separator (Excel in much of Europe), ';';
# "Text (tab delimited)" saves tabs
CSV_DELIMITERS = {",": "','", ";": "';'", "\t": "tab"}


def _csv_delimiter(header_line: str) -> str:
    """The delimiter that splits the header into the most known columns (then the most frequent,
    then ','): no column name contains one, so the header line decides."""
    def score(delimiter: str) -> tuple[int, int]:
        names = next(csv.reader([header_line], delimiter=delimiter), [])
        return sum(name.strip() in CSV_COLUMNS for name in names), header_line.count(delimiter)

    return max(CSV_DELIMITERS, key=score)


def _csv_to_raw(text: str, source: str) -> dict[str, Any]:
    delimiter = _csv_delimiter(text.split("\n", 1)[0])
    rows = csv.reader(io.StringIO(text), delimiter=delimiter)
    header = [name.strip() for name in next(rows, [])]
    unknown = [name for name in header if name and name not in CSV_COLUMNS]
    if unknown:
        raise InventoryError(f"{source}: unknown CSV column(s) {unknown} (header split at "
                             f"{CSV_DELIMITERS[delimiter]}; columns are separated by ',', ';' or "
                             f"tab): fix their names or the delimiter; known: {', '.join(CSV_COLUMNS)}")
    repeated = sorted({name for name in header if name and header.count(name) > 1})
    if repeated:
        raise InventoryError(f"{source}: CSV column(s) {repeated} appear more than once in the "
                             "header: keep one of each")
    stores = []
    for row in rows:
        # a blank line, or a row of empty cells as a spreadsheet saves a cleared row
        if not any(cell.strip() for cell in row):
            continue
        extra = [cell for cell in row[len(header):] if cell.strip()]
        if extra:
            raise InventoryError(f"{source}: line {rows.line_num}: {len(row)} cells but the header "
                                 f"names {len(header)} columns (extra: {extra}): remove them or "
                                 "name their column in the header")
        store: dict[str, Any] = {}
        for position, (column, value) in enumerate(zip(header, row, strict=False), start=1):
            if value.strip() == "":
                continue
            if not column:  # an unnamed (trailing) header cell is harmless while its column is empty
                raise InventoryError(f"{source}: line {rows.line_num}: a value in column "
                                     f"{position}, which has no name in the header: name it "
                                     "or clear the column")
            path = CSV_COLUMNS[column]
            target = store
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[path[-1]] = ([entry.strip() for entry in value.split(";") if entry.strip()]
                                if column in CSV_LIST_COLUMNS else value.strip())
        stores.append(store)
    return {"stores": stores}


def load_inventory(path: str | Path) -> Inventory:
    """Load an inventory from .yaml/.yml or .csv (ERP export)."""
    p = Path(path)
    try:
        if not p.exists():
            where = "" if p.is_absolute() else f" (relative to {Path.cwd()})"
            raise InventoryError(f"inventory file {p} not found{where}: pass an existing file "
                                 "(--inventory on the command line, the inventory parameter of a "
                                 "run)")
        if p.is_dir():
            raise InventoryError(f"inventory {p} is a directory: pass the inventory file in it "
                                 "(.yaml, .yml or .csv), not the directory")
        # utf-8-sig: a spreadsheet's "CSV UTF-8" starts with a byte-order mark, which would
        # otherwise become part of the first column's name
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InventoryError(f"inventory file {p} is not UTF-8 text (byte "
                             f"0x{exc.object[exc.start]:02x} at offset {exc.start}): save it as "
                             "UTF-8 (in a spreadsheet: 'CSV UTF-8')") from None
    except OSError as exc:  # no permission on the file or a directory above it, an I/O error
        raise InventoryError(f"inventory file {p} cannot be read ({exc.strerror or exc}): give the "
                             "user running store-rollout read access to it, or pass a readable "
                             "copy") from None
    if p.suffix.lower() == ".csv":
        return parse_inventory(_csv_to_raw(text, str(p)), str(p))
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InventoryError(f"{p}: not valid YAML ({exc})") from None
    return parse_inventory(raw, str(p))
