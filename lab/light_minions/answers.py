"""The canned returns of a light minion: well-formed answers to the calls the pipeline and
reconcile make (test.ping, grains, saltutil.find_job, storevirt's read and VM calls, event.send,
state calls), as a ready store would give them. Anything else: retcode 1 and a message naming
the function (a real minion's "not available")."""

from __future__ import annotations

from typing import Any

from store_rollout.contracts import (
    FIRSTBOOT_STAGE_GRAIN,
    HARDWARE_SERIAL_GRAIN,
    HYPERVISOR_READY_GRAIN,
    IMAGE_VERSION_GRAIN,
)

IMAGE_VERSION = "1.0.0"


def grains(minion_id: str) -> dict[str, Any]:
    hv = minion_id.endswith("-hv") or "-hv-" in minion_id
    common = {"id": minion_id, "os": "SLES", "os_family": "Suse", "osrelease": "15.7",
              "saltversion": "3006.0", "kernel": "Linux"}
    if hv:
        return {**common, HYPERVISOR_READY_GRAIN: True, HARDWARE_SERIAL_GRAIN: f"SN-{minion_id}"}
    return {**common, FIRSTBOOT_STAGE_GRAIN: "done", IMAGE_VERSION_GRAIN: IMAGE_VERSION}


def _inspect(minion_id: str, arg: list[Any]) -> dict[str, Any]:
    mine = ((arg[0] if arg else None) or {}).get(minion_id) or {}
    return {"domains": {name: {"state": "running", "disk": f"/var/lib/store-images/{name}/sys",
                               "backing": None, "graphics_listen": None, "seed": "detached",
                               "data_disk": None, "image_key": None}
                        for name in mine.get("domains", [])},
            "base_images": {key: True for key in mine.get("base_images", [])}}


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
    if fun in ("storevirt.domain_summary",):
        return _inspect(minion_id, [{minion_id: {"domains": arg[:1]}}])["domains"].get(
            arg[0] if arg else ""), 0
    if fun in ("state.apply", "state.highstate", "state.sls"):
        return _state(minion_id), 0
    if fun in ("event.send", "saltutil.sync_all", "saltutil.refresh_pillar"):
        return True, 0
    return f"'{fun}' is not available.", 1
