"""Pre-staging: the base image onto the stores' hypervisors ahead of the rollout window, so a
wave does not wait on (or saturate) the store links. Wiring only."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.task_runners import ThreadPoolTaskRunner

from store_rollout.image_versions import build_of
from store_rollout.inventory import load_inventory
from store_rollout.settings import load_settings
from store_rollout.settings_parts import ImageSettings, SaltSettings
from tasks.image_targets import target_versions
from tasks.kiwi import ensure_image
from tasks.region_runs import split_by_region
from tasks.run_health import beating
from tasks.virt import stage_image

STAGE_THREADS: Any = ThreadPoolTaskRunner(max_workers=8)


class StagingFailed(Exception):
    """Some stores could not be staged; the message names each and why."""


@flow(name="stage-images", flow_run_name="stage-images", task_runner=STAGE_THREADS)
@beating
def stage_images(inventory: str, store_ids: tuple[str, ...] = (),
                 image_version: str = "") -> dict[str, Any]:
    """Put each store's base image on its hypervisor before its rollout or update (verified
    there, as step 5 would); their step 5, or the update, then transfers nothing. Each version
    is built (or found in the cache) once for all its stores. Hypervisors must be installed.
    Only the stores of this worker's region: each region has its copy of this deployment.

    Args:
        inventory: Inventory file (YAML or CSV) on the worker's host.
        store_ids: Stores to stage (empty: every store of the inventory).
        image_version: Stage this image version (settings image_versions) on every store, for
            an upcoming `update`; empty: each store's own version (its vm.image_version, else
            the chain's image_version).
    """
    settings = load_settings()
    stores, others = split_by_region(load_inventory(inventory).select(list(store_ids)),
                                     settings.region)
    for region, ids in others.items():  # their hosts answer their region's master only
        get_run_logger().info("region %s's stores %s: staged by its stage-images-%s run",
                              region, ", ".join(ids), region)
    salt, images = SaltSettings.of(settings), ImageSettings.of(settings)
    by_id = {store.store_id: store for store in stores}
    groups = target_versions(stores, images, image_version)  # each version built once
    built = {version: ensure_image(*build_of(images, version), images.image_cache_dir,
                                   images.image_builder) for version in groups}
    version_of = {sid: version for version, ids in groups.items() for sid in ids}
    futures = {sid: stage_image.submit(by_id[sid], built[version_of[sid]], salt, images)
               for sid in by_id}
    staged: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for store_id, future in futures.items():
        future.wait()
        if future.state.is_completed():
            staged[store_id] = {**future.result(), "image_version": version_of[store_id]}
        else:
            failed[store_id] = str(future.state.message or future.state.name)
    keys = {version: image["key"] for version, image in built.items()}
    create_table_artifact(
        key="stage-images", description=", ".join(
            f"image {version or 'unversioned'} ({key[:12]})" for version, key in keys.items())
        + " staged",
        table=[{"store": sid, "image": r["image_key"][:12], "transferred": r["transferred"],
                "already there": r["cached"], "seconds": r["seconds"]}
               for sid, r in staged.items()]
        + [{"store": sid, "error": msg} for sid, msg in failed.items()])
    if failed:
        get_run_logger().error("staging failed for %s", ", ".join(sorted(failed)))
        raise StagingFailed("; ".join(f"{sid}: {msg}" for sid, msg in sorted(failed.items())))
    # image_key: the one image when every store runs the same (as before versions)
    return {"image_key": next(iter(keys.values())) if len(keys) == 1 else "",
            "images": keys, "stores": staged}
