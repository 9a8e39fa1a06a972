"""Image versions as `plan` and `reconcile` show them (issue 47): the version each store should
run, the one its VM says it runs (its grain) and the one its host's system disk is on (the
second witness), whether the target's base image is staged on the host, and what an update
would do. Pure functions of the facts (tasks/observe.py reads them)."""

from __future__ import annotations

from pydantic import BaseModel

from store_rollout.contracts import UNVERSIONED_IMAGE
from store_rollout.fleet.facts import StoreFacts


def version_name(version: str | None) -> str:
    """A version as the VM's grain and the image's meta.json spell it ("" is unversioned)."""
    return version or UNVERSIONED_IMAGE


class StoreVersions(BaseModel):
    """One store's image versions. `running`: the VM's grain (None: its minion does not
    answer); `disk`: the version of the base image its system disk is on (None: no domain, the
    host does not answer, or an image this orchestrator's cache does not know); `staged`:
    the target's base image is on the host (None: the host does not answer)."""

    target: str
    target_key: str
    running: str | None = None
    disk: str | None = None
    disk_key: str | None = None
    staged: bool | None = None
    live: bool = False
    would: str = ""


def live(f: StoreFacts) -> bool:
    """The store went live on the VM that exists now (the ERP holds this VM's notice): an
    update has a store server to update."""
    return f.domain is not None and not f.erp_error and f.notice_for_vm() is not None


def store_versions(f: StoreFacts) -> StoreVersions:
    """The store's versions and what `store-rollout update` to its target would do now."""
    target = version_name(f.image_version)
    found = StoreVersions(target=target, target_key=f.image_key, running=f.vm_image_version,
                          disk=f.disk_image_version, disk_key=f.disk_image_key,
                          staged=f.base_image_on_hypervisor if f.domain_known else None,
                          live=live(f))
    return found.model_copy(update={"would": _would(f, found)})


def _would(f: StoreFacts, v: StoreVersions) -> str:
    if not v.live:
        return "not live: roll out first (`store-rollout rollout`), then update"
    running = v.running or v.disk
    if running is None:
        return (f"unknown: {f.vm} does not answer and its disk's image is unknown; an update "
                f"waits for it")
    if running == v.target:
        return f"already on {v.target}"
    staged = ("staged" if v.staged else "not staged: the update downloads it first (or "
              "`store-rollout stage --image` ahead of the window)" if v.staged is False
              else "host not answering: staged unknown")
    return f"update {running} -> {v.target} ({staged})"


def version_line(v: StoreVersions) -> str:
    """One line for a table: running, disk, target."""
    disk = "" if v.disk is None or v.disk == v.running else f", disk {v.disk}"
    return f"{v.running or '?'}{disk} (target {v.target})"


def version_mismatches(f: StoreFacts) -> list[tuple[str, str, str]]:
    """(code, what, fix) of each disagreement about the store's image version: its VM runs a
    version the inventory does not expect (`image-version-mismatch`; the VM's grain says so,
    else, when it reports none, its host's disk does), or its VM's grain and its host's disk
    disagree (`image-version-disagree`). Only for a live store (a rollout under way is said
    elsewhere); nothing when neither witness is known."""
    v = store_versions(f)
    running = v.running or v.disk
    if not v.live or running is None:
        return []
    found = []
    if running != v.target:
        said = "" if v.running else " (its host's disk says so; the VM reports no version)"
        found.append((
            "image-version-mismatch",
            f"VM {f.vm} runs image version {running}, the inventory expects {v.target}{said}",
            f"`store-rollout update {f.store_id} --image {v.target}` in its window; or set "
            f"the store's vm.image_version to {running} if that is the version it should run"))
    if v.running is not None and v.disk is not None and v.disk != v.running:
        found.append((
            "image-version-disagree",
            f"VM {f.vm} says it runs {v.running} but its system disk on {f.hypervisor} is on "
            f"image {(v.disk_key or '?')[:12]} ({v.disk})",
            f"read the host's update record (`salt {f.hypervisor} storevirt.update_record "
            f"{f.domain_name}`), then `store-rollout update {f.store_id} --image {v.target}` or "
            f"`store-rollout revert {f.store_id}` settles the store on one version"))
    return found
