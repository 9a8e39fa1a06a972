"""The Prefect task of the image step (the only place in :mod:`tasks.kiwi` that uses Prefect)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from store_rollout import instrument
from store_rollout.plugins import known_builder
from store_rollout.results import ImageRef
from tasks.kiwi.builders import make_builder
from tasks.kiwi.cache import ImageCache
from tasks.kiwi.errors import KiwiTaskError
from tasks.kiwi.validate import resolve_description

__all__ = ["ensure_image", "image_status"]


@task(task_run_name="image-{description}")
def ensure_image(
    description: str, params: dict[str, str], cache_dir: str, builder: str = "kiwi"
) -> ImageRef:
    """Make sure the image for ``description`` + ``params`` is in the cache.

    Args:
        description: Name under ``image_builds/`` (``leap16-jeos``) or a description's directory.
        params: Build parameters, e.g. ``{"SALT_MASTER": "10.20.0.1"}``; ``KIWI_PROFILE``
            selects a KIWI profile (a builder may read others of its own).
        cache_dir: Image cache directory.
        builder: ``kiwi`` (real kiwi-ng build, root) or a builder another install registers
            (:mod:`store_rollout.plugins`).

    Returns:
        An ``ImageRef`` (store_rollout/results.py): ``{"key", "path", "sha256", "meta",
        "cache_hit", "seconds", "build_seconds", "kiwi_seconds"}``.

    Example:
        >>> @flow
        ... def images():
        ...     return ensure_image("leap16-jeos", {"SALT_MASTER": "127.0.0.1"}, "/srv/cache")
    """
    logger = get_run_logger()
    known_builder(builder)
    desc_dir = resolve_description(description)
    cache = Path(cache_dir)
    logger.info("Ensuring image %s with builder %s in %s", description, builder, cache)
    try:
        ref = ImageCache(cache).ensure(
            desc_dir, params, make_builder(builder, cache), log=logger.info
        )
        instrument.add("kiwi", ref.build_seconds)
    except KiwiTaskError:
        logger.exception("Image %s (builder %s) failed", description, builder)
        raise
    return ImageRef(key=ref.key, path=str(ref.path), sha256=ref.meta["sha256"], meta=ref.meta,
                    cache_hit=ref.cache_hit, seconds=round(ref.seconds, 3),
                    build_seconds=round(ref.build_seconds, 3),
                    kiwi_seconds=round(ref.kiwi_seconds, 3))


def image_status(description: str, params: dict[str, str], cache_dir: str,
                 builder: str = "kiwi") -> dict[str, Any]:
    """What the image step would do now, without doing it: ``{"key", "cached", "builder"}``."""
    known_builder(builder)
    cache = Path(cache_dir)
    key, meta = ImageCache(cache).lookup(resolve_description(description), params,
                                         make_builder(builder, cache))
    return {"key": key, "cached": meta is not None, "builder": builder}
