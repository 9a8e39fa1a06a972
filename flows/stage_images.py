"""Pre-staging: the base image onto the stores' hypervisors ahead of the rollout window, so a
wave does not wait on (or saturate) the store links. Wiring only."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.task_runners import ThreadPoolTaskRunner

from store_rollout.inventory import load_inventory
from store_rollout.settings import load_settings
from store_rollout.settings_parts import ImageSettings, SaltSettings
from tasks.kiwi import ensure_image
from tasks.region_runs import split_by_region
from tasks.run_health import beating
from tasks.virt import stage_image

STAGE_THREADS: Any = ThreadPoolTaskRunner(max_workers=8)


class StagingFailed(Exception):
    """Some stores could not be staged; the message names each and why."""


@flow(name="stage-images", flow_run_name="stage-images", task_runner=STAGE_THREADS)
@beating
def stage_images(inventory: str, store_ids: tuple[str, ...] = ()) -> dict[str, Any]:
    """Put the base image on the stores' hypervisors before their rollout (verified there, as
    step 5 would); their step 5 then transfers nothing. Hypervisors must be installed. Only
    the stores of this worker's region: each region has its copy of this deployment.

    Args:
        inventory: Inventory file (YAML or CSV) on the worker's host.
        store_ids: Stores to stage (empty: every store of the inventory).
    """
    settings = load_settings()
    stores, others = split_by_region(load_inventory(inventory).select(list(store_ids)),
                                     settings.region)
    for region, ids in others.items():  # their hosts answer their region's master only
        get_run_logger().info("region %s's stores %s: staged by its stage-images-%s run",
                              region, ", ".join(ids), region)
    image = ensure_image(settings.image_description, settings.image_params,
                         settings.image_cache_dir, settings.image_builder)
    salt, images = SaltSettings.of(settings), ImageSettings.of(settings)
    futures = {store.store_id: stage_image.submit(store, image, salt, images) for store in stores}
    staged: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for store_id, future in futures.items():
        future.wait()
        if future.state.is_completed():
            staged[store_id] = future.result()
        else:
            failed[store_id] = str(future.state.message or future.state.name)
    create_table_artifact(
        key="stage-images", description=f"image {image['key']} staged",
        table=[{"store": sid, "transferred": r["transferred"], "already there": r["cached"],
                "seconds": r["seconds"]} for sid, r in staged.items()]
        + [{"store": sid, "error": msg} for sid, msg in failed.items()])
    if failed:
        get_run_logger().error("staging failed for %s", ", ".join(sorted(failed)))
        raise StagingFailed("; ".join(f"{sid}: {msg}" for sid, msg in sorted(failed.items())))
    return {"image_key": image["key"], "stores": staged}
