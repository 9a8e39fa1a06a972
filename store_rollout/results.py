"""What the rollout's steps hand on: the image step's `ImageRef` (to step 5 and the staging),
step 2's `InstallResult` (to steps 3 and 5), and the run's result built from every step's
(`rollout_result`: the flow's return value, which its report, the CLI, the batch and the tests
read).

TypedDicts: each is the same JSON it was as a plain dict (Prefect keeps task and flow results
as they are), now with its keys named and checked.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from store_rollout.inventory import Store


class ImageRef(TypedDict):
    """The image step's result (tasks/kiwi `ensure_image`): the cached image a store VM's disk
    is an overlay of, and what producing it cost in this call."""

    key: str  # content address: sha256 over the description and the build parameters
    path: str
    sha256: str  # the image file's
    meta: dict[str, Any]
    cache_hit: bool
    seconds: float
    build_seconds: float
    kiwi_seconds: float


class InstallResult(TypedDict):
    """Step 2's result (`pxe_install_hypervisor`). `skipped`: the host is installed and ready
    (step 3's answer); `silent`: installed, not answering ready now (step 3 waits for it);
    `install_underway`: an earlier run's install is left to finish; `power_actions`: what the
    BMC did ([] for none); `window`: the maintenance window decision, when one was asked
    (outside one the step changed nothing); `authorization`: the guard's record of a
    destructive action."""

    system: str
    created: bool
    skipped: bool
    silent: bool
    install_underway: bool
    power_actions: list[str]
    authorization: dict[str, Any] | None
    window: NotRequired[dict[str, Any]]


class SilentHost(TypedDict, total=False):
    """What step 2 did about an installed host that does not answer: left it (`silent`), or
    powered it on from its disk (`power_actions`, the guard's `authorization`)."""

    silent: bool
    power_actions: list[str]
    authorization: dict[str, Any] | None


def rollout_result(store: Store, *, image: ImageRef, install: InstallResult,
                   retired: dict[str, Any] | None, hv_wait: dict[str, Any],
                   keys: dict[str, Any], vm: dict[str, Any], booted: dict[str, Any],
                   go_live: dict[str, Any], erp: dict[str, Any], replaced: dict[str, Any] | None,
                   approval: dict[str, Any], step_seconds: dict[str, float]) -> dict[str, Any]:
    """A completed rollout's result, from its steps' results (`retired`, `replaced`: the old
    box's retirement and the ERP's "replaced" notice of a replacement, else None)."""
    return {
        "store_id": store.store_id, "state": "Completed", "hypervisor": store.hypervisor_minion_id,
        "vm_minion": store.vm_minion_id, "vm": vm, "erp_id": erp["erp_id"],
        "hypervisor_reinstalled": not install["skipped"] and not install["silent"],
        # what the guard decided for each destructive action of the run (who asked, who
        # approved, which window), store_rollout/guard.py
        "authorizations": [a for a in ((retired or {}).get("authorization"),
                                       install.get("authorization"), vm.get("authorization"))
                           if a],
        # what step 2 had the BMC do ([] when it found the host installed, or installing)
        "hypervisor_power_actions": install["power_actions"],
        "hypervisor_highstate_reapplied": hv_wait["highstate_reapplied"],
        "hypervisor_serial": hv_wait["serial"],  # checked against the inventory's
        # a disruptive step (2 or 5) started outside a window by ignore_windows
        "window_overridden": bool((install.get("window") or {}).get("overridden")
                                  or vm["window_overridden"]),
        "hypervisor_extensions_synced": keys["extensions_synced"],
        "approval": approval,
        "image_key": image["key"], "image_cache_hit": image["cache_hit"],
        "image_build_seconds": image.get("build_seconds"),
        # seconds into step 6 of each stage and minion start, and each stage's boot id
        "firstboot": {key: booted.get(key) for key in
                      ("stages", "minion_starts", "boot_ids", "boots_seen", "resets")},
        "go_live_checks": go_live["checks"],
        # the old box's retirement and the ERP's "replaced" notice (replace_box)
        "replaced": replaced and {**(retired or {}), "new_mac": store.hypervisor.mac,
                                  "erp_id": replaced["erp_id"]},
        "step_seconds": step_seconds,
    }
