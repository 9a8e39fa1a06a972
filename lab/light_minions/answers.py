"""The canned returns of a light minion: well-formed answers to the calls the pipeline and
reconcile make (test.ping, grains, saltutil.find_job, storevirt's read and VM calls, event.send,
state calls, and a rollout's rerun of a live store: step 4's extension check, step 5's domain,
step 6's bootstrap files and seed, step 7's gate), as a ready store would give them. Anything
else: retcode 1 and a message naming the function (a real minion's "not available")."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from store_rollout.contracts import (
    FIRSTBOOT_STAGE_GRAIN,
    GO_LIVE_FUNCTION,
    HARDWARE_SERIAL_GRAIN,
    HYPERVISOR_READY_GRAIN,
    IMAGE_VERSION_GRAIN,
)

# the version a live store's VM runs: the chain's, as the region tells the swarm
IMAGE_VERSION = os.environ.get("LIGHT_MINION_IMAGE_VERSION", "1.0.0")
# the master's served extension hashes (a JSON file the region writes), so step 4 finds the
# store's modules current as a live store's are; without it, the minion syncs (answers [])
HASHES_ENV = "LIGHT_MINION_EXTENSION_HASHES"
BOOTSTRAP_FILES = ("/etc/salt/minion.d/90-bootstrap.conf", "/etc/salt/minion.d/15-identity.conf")


def _served_hashes() -> dict[str, str]:
    path = os.environ.get(HASHES_ENV)
    return json.loads(open(path).read()) if path else {}  # noqa: SIM115


def store_of(minion_id: str) -> str:
    """The store id in `store-<id>-hv` / `store-<id>-vm`."""
    return minion_id.removeprefix("store-").rsplit("-", 1)[0]


def vm_domain(vm_name: str) -> dict[str, Any]:
    """storevirt.domain_summary of a live store's VM: running, autostarted, its seed retired,
    the same uuid every time (the ERP's earlier notice names it)."""
    return {"name": vm_name, "uuid": str(uuid.uuid5(uuid.NAMESPACE_DNS, vm_name)),
            "active": True, "autostart": True, "state": "running",
            "disk": f"/var/lib/store-images/{vm_name}/system.qcow2", "backing": None,
            "graphics": None, "graphics_listen": None, "data_disk": None, "image_key": None,
            "seed": {"minion_id": vm_name, "store_id": store_of(vm_name), "state": "retired",
                     "attached": False}}


def gate_rows() -> list[dict[str, Any]]:
    """storegate.run of a store server that serves: each check passed."""
    return [{"check": f"service {name} runs", "kind": "service", "passed": True,
             "observed": "active", "expected": "active"}
            for name in ("store-pos-gateway", "store-inventory-sync")]


def grains(minion_id: str) -> dict[str, Any]:
    hv = minion_id.endswith("-hv") or "-hv-" in minion_id
    common = {"id": minion_id, "os": "SLES", "os_family": "Suse", "osrelease": "15.7",
              "saltversion": "3006.0", "kernel": "Linux"}
    if hv:
        return {**common, HYPERVISOR_READY_GRAIN: True, HARDWARE_SERIAL_GRAIN: f"SN-{minion_id}"}
    return {**common, FIRSTBOOT_STAGE_GRAIN: "done", IMAGE_VERSION_GRAIN: IMAGE_VERSION}


def _inspect(minion_id: str, arg: list[Any]) -> dict[str, Any]:
    """Either form of storevirt.inspect: the region's map (this minion's entry), or keyword
    base_images alone (every domain of the host: a store host runs its store's VM)."""
    first = (arg[0] if arg else None) or {}
    if first.get("__kwarg__"):  # Salt packs keyword arguments so
        mine = {"domains": [minion_id.removesuffix("-hv") + "-vm"],
                "base_images": first.get("base_images") or []}
    else:
        mine = first.get(minion_id) or {}
    found: dict[str, Any] = {
        "domains": {name: vm_domain(name) for name in mine.get("domains", [])},
        "base_images": {key: True for key in mine.get("base_images", [])}}
    return {**found, "every_domain": True} if first.get("__kwarg__") else found


def _state(minion_id: str) -> dict[str, Any]:
    return {"test_|-light_minion_|-light_minion_|-nop": {
        "result": True, "changes": {}, "comment": "light minion: nothing to do",
        "__id__": "light_minion", "__run_num__": 0, "name": "light_minion"}}


def answer(minion_id: str, fun: str, arg: list[Any]) -> tuple[Any, int]:
    """(return, retcode) of `fun(*arg)` on this simulated minion."""
    if fun == "test.ping":
        return True, 0
    if fun == "saltutil.find_job":
        return {}, 0  # the job is done (a light minion answers at once)
    if fun == "grains.items":
        return grains(minion_id), 0
    if fun == "grains.item":
        mine = grains(minion_id)
        return {name: mine.get(name, "") for name in arg if isinstance(name, str)}, 0
    if fun == "grains.get":
        return grains(minion_id).get(str(arg[0]) if arg else "", ""), 0
    if fun == "storevirt.inspect":
        return _inspect(minion_id, arg), 0
    if fun == "storevirt.domain_summary":
        return vm_domain(str(arg[0])) if arg else None, 0
    if fun == "storevirt.extension_hashes":
        return _served_hashes(), 0
    if fun in ("saltutil.sync_utils", "saltutil.sync_modules"):
        return [], 0
    if fun == "storevirt.retire_seed":
        name = str(arg[0]) if arg else ""
        return {"seed": f"/var/lib/store-images/{name}/seed.iso", "state": "retired",
                "deleted": False}, 0
    if fun == "provisioning.bootstrap_files":
        return list(BOOTSTRAP_FILES), 0
    if fun == "file.file_exists":
        return False, 0  # firstboot removed them
    if fun == GO_LIVE_FUNCTION:
        return gate_rows(), 0
    if fun in ("state.apply", "state.highstate", "state.sls"):
        return _state(minion_id), 0
    if fun in ("event.send", "saltutil.sync_all", "saltutil.refresh_pillar"):
        return True, 0
    return f"'{fun}' is not available.", 1
