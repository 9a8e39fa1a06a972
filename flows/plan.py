"""Plan: what a rollout of each store would do now, step by step, changing nothing.

Wiring only: the reads are tasks/observe.py, the conclusions store_rollout/fleet/.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from store_rollout.fleet.backups import with_restore
from store_rollout.fleet.plan import StepPlan, first_todo, plan_store
from store_rollout.fleet.render import plan_markdown
from store_rollout.fleet.versions import StoreVersions, store_versions
from store_rollout.guard import calendar_for
from store_rollout.inventory import InventoryError, load_inventory
from store_rollout.inventory.calendar_spec import next_window_of
from store_rollout.inventory.replacement import with_new_box
from store_rollout.settings import load_settings
from store_rollout.step_timeouts import STEP_TIMEOUTS
from tasks.observe import observe_stores
from tasks.region_runs import publish_result, run_in_region, split_by_region
from tasks.run_health import beating

ARTIFACT_KEY = "store-plan"


def _run_name() -> str:
    store_ids = flow_run.parameters.get("store_ids") or []
    return f"plan-{store_ids[0]}" if len(store_ids) == 1 else f"plan-{len(store_ids)}-stores"


@flow(name="store-plan", flow_run_name=_run_name)
@beating
def store_plan(store_ids: list[str], inventory: str,
               highstate_test: bool = True, recreate_vm: bool = False,
               reinstall_hypervisor: bool = False,
               replace_box: dict[str, Any] | None = None,
               hypervisor_timeout: float = STEP_TIMEOUTS.hypervisor_timeout,
               image_version: str = "") -> dict[str, Any]:
    """What a rollout of each store started now would do, without changing anything: Cobbler
    record (field by field), netboot and power cycle, the hypervisor's states in test=True,
    keys, domain, image and ERP notice. Stores of other regions are planned by runs of their
    region's copy of this deployment (subflow runs of this one), from their own systems.

    Args:
        store_ids: Stores to plan, as written in the inventory (e.g. ["0001", "0002"]).
        inventory: Inventory file (YAML or CSV) on the worker's host; a relative path is read from
            the store-rollout checkout the worker runs in.
        highstate_test: Also run each answering hypervisor's highstate with test=True and list
            the states that would change (a few seconds per host).
        recreate_vm: Plan a rollout that recreates each store's VM (`rollout --recreate-vm`):
            its step 5 is destructive where a VM exists.
        reinstall_hypervisor: Plan a rollout that reinstalls each store's host
            (`rollout --reinstall-hypervisor`): its step 2 is destructive where the host is
            installed and ready.
        replace_box: Plan moving the one store given to a new box (`store-rollout replace`):
            the new box's fields, as that run takes them (`mac` at least).
        hypervisor_timeout: The hypervisor_timeout of the rollout planned, as its step 2 takes
            it: a host an earlier run powered on into its install less than this long ago is
            left to that install.
        image_version: Plan an update of every store to this image version (settings
            image_versions); empty: each store's own (its vm.image_version, else the chain's).
            Each store's `image` says its running, disk and target versions, whether the
            target is staged on its host, and what `store-rollout update` would do.
    """
    inv = load_inventory(inventory)
    stores = inv.select(store_ids)  # validated before any call
    if replace_box:
        if len(stores) != 1:
            raise InventoryError(f"replace_box: plan one store, not {len(stores)}")
        stores = [with_new_box(inv, stores[0].store_id, replace_box)]
    settings = load_settings()
    own, others = split_by_region(stores, settings.region)
    remote = [run_in_region.submit("store-plan", region, {
        "store_ids": ids, "inventory": inventory, "highstate_test": highstate_test,
        "recreate_vm": recreate_vm, "reinstall_hypervisor": reinstall_hypervisor,
        "replace_box": replace_box, "hypervisor_timeout": hypervisor_timeout,
        "image_version": image_version})
        for region, ids in others.items()]
    facts = (observe_stores(own, settings, highstate_test=highstate_test,
                            install_seconds=hypervisor_timeout, image_version=image_version)
             if own else {})
    plans = {sid: with_restore(plan_store(f, recreate_vm, reinstall_hypervisor,
                                          bool(replace_box)), f, bool(replace_box))
             for sid, f in facts.items()}
    # each store's platform and image versions as its own region's systems gave them
    platforms = {sid: f.platform for sid, f in facts.items()}
    versions = {sid: store_versions(f) for sid, f in facts.items()}
    for part in remote:
        for sid, planned in part.result().items():
            plans[sid] = [StepPlan.model_validate(step) for step in planned["steps"]]
            platforms[sid] = planned.get("platform", "")
            versions[sid] = StoreVersions.model_validate(planned["image"])
    plans = {store.store_id: plans[store.store_id] for store in stores}  # the inventory's order
    result = plan_result(plans, platforms, versions, {
        store.store_id: calendar_for(store, settings.default_calendar) for store in stores})
    publish_result("store-plan", result)
    return result


def plan_result(plans: dict[str, list[StepPlan]], platforms: dict[str, str],
                versions: dict[str, StoreVersions], calendars: dict[str, Any]) -> dict[str, Any]:
    """The plan's result per store (and its Markdown artifact): the steps, the platform, the
    next window and the image versions (`image`: running, disk, target, staged, would)."""
    now = datetime.now(UTC)
    windows = {sid: next_window_of(calendars[sid], now) for sid in plans}
    create_markdown_artifact(key=ARTIFACT_KEY, markdown=plan_markdown(
        plans, platforms, versions, {sid: window_text(w) for sid, w in windows.items()}),
        description=f"rollout plan of {len(plans)} store(s)")
    return {sid: {"platform": platforms[sid], "todo": [p.step for p in plan if p.todo],
                  "resumes_at": (first_todo(plan) or (None, None))[1],
                  "destructive": [p.step for p in plan if p.destructive],
                  "next_window": windows[sid], "image": versions[sid].model_dump(mode="json"),
                  "steps": [p.model_dump(mode="json") for p in plan]}
            for sid, plan in plans.items()}


def window_text(window: dict[str, Any] | None) -> str:
    """A store's next window in one line (the plan's versions table)."""
    if window is None:
        return "none (no calendar)"
    if "none" in window:
        return str(window["none"])
    return ("open now: " if window.get("open_now") else "next: ") + str(window.get("text"))
