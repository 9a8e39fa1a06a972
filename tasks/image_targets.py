"""Which image each store should run and what a cached image is, by version (issue 47): the
target version of each store (its inventory's `vm.image_version`, else the chain's, or one
named for an upcoming update), each version's image looked up once (`image_status`, nothing
built), and the version an image key was built as (its meta.json's IMAGE_VERSION). Read by
plan, reconcile (tasks/observe.py) and stage-images, which builds each version once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from store_rollout.image_versions import (
    VersionedImages,
    build_of,
    known,
    store_version,
    version_of_params,
)
from store_rollout.inventory import Store
from tasks.kiwi import ImageCache, image_status


def target_versions(stores: list[Store], images: VersionedImages,
                    image_version: str = "") -> dict[str, list[str]]:
    """version -> the stores (ids, in order) that should run it: `image_version` for every
    store when named (an upcoming update), else each store's own (store_version). An unlisted
    version fails here, naming the field, before anything is read or built."""
    if image_version:
        known(images, image_version, "image_version")
    by_version: dict[str, list[str]] = {}
    for store in stores:
        version = image_version or store_version(images, store.vm.image_version)
        by_version.setdefault(version, []).append(store.store_id)
    return by_version


def target_images(stores: list[Store], images: VersionedImages, cache_dir: str, builder: str,
                  image_version: str = "") -> dict[str, dict[str, Any]]:
    """store id -> {"version", "key", "cached", "builder"}: the image each store should run,
    each version looked up once in the cache (built by nobody here)."""
    found: dict[str, dict[str, Any]] = {}
    for version, ids in target_versions(stores, images, image_version).items():
        description, params = build_of(images, version)
        status = image_status(description, params, cache_dir, builder)
        found.update({sid: {**status, "version": version} for sid in ids})
    return found


def version_of_key(cache_dir: str, key: str | None) -> str | None:
    """The version the cached image `key` was built as; None when the cache does not hold it
    (an image built elsewhere, or pruned): unknown, never guessed."""
    meta = ImageCache(Path(cache_dir)).meta(key) if key else None
    return None if meta is None else version_of_params(dict(meta.get("params") or {}))
