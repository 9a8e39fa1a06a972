"""The store's data disk outside the image update: where it is, what each destructive action
does to it (said before the action, in its plan, its approval and its log), and where a
decommission keeps its export.

- rollback, VM recreation, a cancelled rollout's clean-up: the data disk stays on the host
  (storevirt.remove_vm keeps it), and the next step 5 attaches it again;
- a reinstall of the host: the PXE install wipes the host's disk, the data disk with it; no
  export is made by a reinstall;
- a replacement: the old box is powered off with the data disk on it; the new box's store
  server starts with a new, empty one;
- decommission: the data disk is removed, after an export of it (a gzip'd sparse tar of
  data.raw, its sha256 beside it) is kept in the `data_export_dir` setting's directory on the
  orchestrator's host, unless the run is told not to (`keep_export` false, `--no-export`).
"""

from __future__ import annotations

import posixpath
import re
from datetime import datetime
from typing import Final

from store_rollout.contracts import DATA_DISK_FILE
from store_rollout.inventory import Store

DEFAULT_DATA_EXPORT_DIR: Final = "/var/lib/store-rollout/data-exports"
# where the host's cp.push puts an export in the master's cache (minions/<host>/files/...):
# taken out of there at once (a deleted key's cache goes with it on Salt 3006)
PUSH_DIR: Final = "store-rollout/data-exports"
EXPORT_SUFFIX: Final = ".tar.gz"
_STAMP: Final = "%Y%m%dT%H%M%SZ"
_EXPORT_RE: Final = re.compile(r"^(?P<vm>.+)-data-(?P<stamp>\d{8}T\d{6}Z)\.tar\.gz$")


def data_disk_path(store: Store, images_dir: str) -> str:
    """The store's data disk on its host, as storevirt lays it out."""
    return posixpath.join(images_dir, store.vm_name, DATA_DISK_FILE)


def export_name(store: Store, when: datetime) -> str:
    """The file name of an export of the store's data disk made at `when` (UTC)."""
    return f"{store.vm_name}-data-{when.strftime(_STAMP)}{EXPORT_SUFFIX}"


def is_export_name(store: Store, name: str) -> bool:
    found = _EXPORT_RE.match(name)
    return found is not None and found["vm"] == store.vm_name


def _named(path: str | None) -> str:
    return f"the store's data disk {path}" if path else "the store's data disk, if any"


def kept(host: str, path: str | None) -> str:
    """What a rollback or a recreation says of the data disk."""
    return f"{_named(path)} on {host} is kept (only a decommission removes it)"


def lost_with_host(host: str, path: str | None) -> str:
    """What a reinstall of the store's host says before it starts."""
    return (f"{_named(path)} on {host} is lost with the host's disk; no export is made by a "
            "reinstall (a decommission keeps one)")


def left_on_old_box(host: str, path: str | None) -> str:
    """What a replacement says before it retires the old box."""
    return (f"{_named(path)} stays on the old box {host}, powered off (no export is made); the "
            "new box's store server starts with a new, empty data disk")


def decommission_note(store: Store, path: str, keep_export: bool, export_dir: str) -> str:
    """What a decommission says of the data disk before it starts (its approval, its log)."""
    host = store.hypervisor_minion_id
    if not keep_export:
        return (f"{_named(path)} on {host} is removed WITHOUT an export (--no-export): its "
                "data is gone for good")
    return (f"{_named(path)} on {host} is removed, after an export of it is kept in "
            f"{posixpath.join(export_dir, store.store_id)}/ on the orchestrator's host (gzip'd "
            "sparse tar, its sha256 beside it)")
