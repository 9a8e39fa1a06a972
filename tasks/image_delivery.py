"""The base image onto a store's hypervisor: its minion downloads it from the image server
(`storevirt.ensure_base_image`, salt_states/_modules) and verifies it there; a cut download is
resumed, never restarted. Steps 5 (create_vm) and the pre-staging (stage_image) both deliver
through here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from store_rollout.contracts import DOWNLOAD_CUT
from store_rollout.inventory import Store
from store_rollout.results import ImageRef
from store_rollout.settings_parts import ImageSettings
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


def deliver_image(master: SaltMasterClient, store: Store, settings: ImageSettings,
                  image: ImageRef) -> dict[str, Any]:
    """The base image on the store's hypervisor, downloaded by it from the image server and
    verified there; a cut download is resumed (a few times), never restarted."""
    url = f"{settings.image_base_url}/{image['key']}/image.qcow2"
    ca_pem = Path(settings.image_ca_bundle).read_text() if settings.image_ca_bundle else None
    for attempt in Retrying(stop=stop_after_attempt(5), wait=wait_exponential(max=10),
                            retry=retry_if_exception_type(ImageDownloadCut), reraise=True):
        with attempt, _cut_as_a_type():
            result: dict[str, Any] = master.cmd(
                store.hypervisor_minion_id, "storevirt.ensure_base_image",
                [url, image["key"], image["sha256"]],
                kwarg={"meta": image["meta"], "ca_pem": ca_pem,
                       "rate_limit": settings.image_rate_limit or None},
                timeout=DOWNLOAD_TIMEOUT)
    return result
