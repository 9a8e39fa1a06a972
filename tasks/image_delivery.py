"""The base image onto a store's hypervisor: its minion downloads it from the image server
(`storevirt.ensure_base_image`, salt_states/_modules) and verifies it there; a cut download is
resumed, never restarted. Steps 5 (create_vm) and the pre-staging (stage_image) both deliver
through here.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from store_rollout.contracts import DOWNLOAD_CUT
from store_rollout.image_delta import offer_delta
from store_rollout.inventory import Store
from store_rollout.results import ImageRef
from store_rollout.settings_parts import ImageSettings
from tasks.run_health import run_logger
from tasks.salt import SaltCommandFailed, SaltMasterClient

DOWNLOAD_TIMEOUT = 3 * 3600  # seconds one download call may take (~1.5 GB over a slow link)


class ImageDownloadCut(SaltCommandFailed):
    """The hypervisor's image download stopped midway: the next attempt resumes where it did."""


@contextmanager
def _cut_as_a_type() -> Iterator[None]:
    """Salt carries the minion's error as text: a cut download is told apart here, once."""
    try:
        yield
    except SaltCommandFailed as exc:
        if DOWNLOAD_CUT not in exc.detail:
            raise
        raise ImageDownloadCut(exc.minion_id or "", exc.fun, exc.retcode, exc.detail) from exc


def _delta_or_none(settings: ImageSettings, old_key: str, image: ImageRef) -> dict[str, Any] | None:
    """The delta to offer, or None: a delta that cannot be made (qemu-img, a full disk, a
    cached image that fails its check) costs the full download, never the staging."""
    try:
        return offer_delta(Path(settings.image_cache_dir), old_key, image["key"], image["sha256"])
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        run_logger(__name__).warning("image %s: no delta from %s (%s); the full image goes",
                                 image["key"][:12], old_key[:12], exc)
        return None


def deliver_image(master: SaltMasterClient, store: Store, settings: ImageSettings,
                  image: ImageRef, old_key: str | None = None,
                  in_window: Callable[[], object] = lambda: None) -> dict[str, Any]:
    """The base image on the store's hypervisor, downloaded by it from the image server and
    verified there; a cut download is resumed (a few times), never restarted. With `old_key`
    (the base image the host runs on) the host is offered the delta from it: it fetches only
    that when it holds `old_key`, else (or on any refusal) the full image. The result says
    which ("mode": full, delta or cached), bytes moved ("transferred") and "full_size".
    `in_window` returns once bytes may cross the store's link (the download window): asked
    before each resume, so a download cut after its window closed goes on in the next one, not
    at once. The caller asks it before calling (it keeps the window's answer)."""
    url = f"{settings.image_base_url}/{image['key']}/image.qcow2"
    ca_pem = Path(settings.image_ca_bundle).read_text() if settings.image_ca_bundle else None
    kwarg: dict[str, Any] = {"meta": image["meta"], "ca_pem": ca_pem,
                             "rate_limit": settings.image_rate_limit or None}
    offer = _delta_or_none(settings, old_key, image) if old_key else None
    if offer:
        name = offer.pop("file")
        kwarg["delta"] = {**offer, "source": f"{settings.image_base_url}/{image['key']}/{name}"}
    for attempt in Retrying(stop=stop_after_attempt(5), wait=wait_exponential(max=10),
                            retry=retry_if_exception_type(ImageDownloadCut), reraise=True):
        with attempt, _cut_as_a_type():
            if attempt.retry_state.attempt_number > 1:
                in_window()
            result: dict[str, Any] = master.cmd(
                store.hypervisor_minion_id, "storevirt.ensure_base_image",
                [url, image["key"], image["sha256"]], kwarg=kwarg, timeout=DOWNLOAD_TIMEOUT)
    return result
