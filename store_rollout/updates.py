"""What an image update (`store-rollout update`) or a manual revert of one store decides, from
what the store's systems say, not from anyone's memory: the ERP (is the store live), the host
(its domain, the system disk's base image, the update record storevirt writes BEFORE it switches
the system disk) and the VM (the image version its grain reports).

Pure functions: the flow (flows/image_update.py) reads, calls these, and acts; a rerun after a
crash of the orchestrator reads the host's record again and goes on from there.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final, Literal

from store_rollout.contracts import ERP_STORE_IMAGE_UPDATED, UNVERSIONED_IMAGE
from store_rollout.image_versions import VersionedImages, known, store_version

# how long an update waits for the VM's minion after a boot before it reverts (flow parameter)
VM_BACK_TIMEOUT: Final = 600.0
# the step that reads the store's state first (live or not, versions, the host's record)
STEP_STATE: Final = "update_state"

# the record's phases (storevirt.switch_system_disk, revert_system_disk, commit_update)
SWITCHED: Final = "switched"
COMMITTED: Final = "committed"
REVERTED: Final = "reverted"

# the steps of an update, in order (each a task run `<step>-<store>`, timed by StepClock); the
# store is down from the start of `shutdown` to the end of `vm_back`
STEP_STAGE: Final = "stage"
STEP_SHUTDOWN: Final = "shutdown"
STEP_SWITCH: Final = "switch"
STEP_BOOT: Final = "boot"
STEP_VM_BACK: Final = "vm_back"
STEP_UPDATE_HIGHSTATE: Final = "update_highstate"
STEP_VERSION: Final = "version"
STEP_GO_LIVE: Final = "go_live"
STEP_COMMIT: Final = "commit"
# what each check on the new version is called where a run names the one that failed
CHECKS: Final = {
    STEP_SWITCH: "the switch of the system disk",
    STEP_BOOT: "the boot of the new system disk",
    STEP_VM_BACK: "the VM's minion coming back",
    STEP_UPDATE_HIGHSTATE: "the update highstate (state.apply store_vm)",
    STEP_VERSION: "the version the VM reports",
    STEP_GO_LIVE: "the go-live gate",
}
DOWN_STEPS: Final = (STEP_SHUTDOWN, STEP_SWITCH, STEP_BOOT, STEP_VM_BACK)
# the revert's steps (after a failed check, or a manual revert)
STEP_REVERT: Final = "revert"
STEP_REVERT_BOOT: Final = "revert_boot"
STEP_REVERT_VM_BACK: Final = "revert_vm_back"
STEP_REVERT_GO_LIVE: Final = "revert_go_live"
REVERT_DOWN_STEPS: Final = (STEP_REVERT, STEP_REVERT_BOOT, STEP_REVERT_VM_BACK)

Action = Literal["already", "update", "finish"]


class StoreNotLive(RuntimeError):
    """Only a live store is updated or reverted: one the ERP knows, whose domain exists on its
    host and whose VM minion's key is accepted (nothing was changed)."""


class NothingToRevert(RuntimeError):
    """The store's host holds no update record: no update ever switched its system disk."""


class UpdateReverted(RuntimeError):
    """A check of the new version failed: the store runs its previous version again (the run
    ends Failed with this message, which names the check)."""


class RevertFailed(RuntimeError):
    """Going back to the previous system disk did not bring the store server back."""


@dataclass(frozen=True)
class UpdateDecision:
    """What an update run does: `already` (the VM runs the version, on that image: nothing
    touched), `update` (the whole sequence) or `finish` (a crashed run switched the system disk
    and never committed: boot it if needed, check it, commit or revert). `to_version` is the
    version the run checks the VM for; `disk` a `finish`'s new system disk, `switch_again` when
    the record was written but the domain still uses its old disk (the crash came between)."""

    action: Action
    reason: str
    from_version: str
    to_version: str
    disk: str = ""
    switch_again: bool = False


def target_version(images: VersionedImages, asked: str, store_field: str | None) -> str:
    """The version to update to: the one asked for (a run parameter, `--image`), else the one
    the store should run (inventory vm.image_version, else the chain's image_version); a
    version the settings do not list, or none at all, is refused before any change."""
    version = (known(images, asked, "image_version") if asked
               else store_version(images, store_field))
    if not version:
        raise ValueError("image_version: name the version to update to (`--image VERSION`, one "
                         "of the settings' image_versions); neither the store's inventory "
                         "vm.image_version nor the chain's image_version names one")
    return version


def switched(record: dict[str, Any] | None) -> bool:
    """A switch recorded and neither committed nor reverted since."""
    return bool(record) and (record or {}).get("phase") == SWITCHED


def not_live(erp_live: bool, domain: dict[str, Any] | None, key_state: str | None,
             running_version: str | None, record: dict[str, Any] | None) -> str | None:
    """Why the store is no live store to update (None: it is). A VM that does not answer is
    refused too, unless a crashed update left it switched (then the run finishes that one)."""
    if not erp_live:
        return "the ERP knows no running store server of it (never live, or decommissioned)"
    if domain is None:
        return "its store server's domain is not on its hypervisor"
    if key_state != "accepted":
        return f"its VM minion's key is not accepted ({key_state or 'no key'})"
    if running_version is None and not switched(record):
        return "its VM minion does not answer (its running version cannot be read)"
    return None


def without_data_disk(store_id: str, domain: dict[str, Any]) -> str | None:
    """Why a live store's VM cannot take a new system disk: without a data disk (a VM defined
    before data disks existed) its identity, key and data live on the system disk, and the
    image's minion waits for the data disk's mount (None: it has one)."""
    if domain.get("data_disk"):
        return None
    return (f"store {store_id}: its VM {domain.get('name')} has no data disk (defined before "
            "data disks existed): a new system disk would boot without its minion's identity "
            "and the store's data; nothing changed. Give it a data disk first (recreate the VM "
            "in its window after saving the store's data: docs/operations.md, Image updates)")


def decide_update(record: dict[str, Any] | None, domain: dict[str, Any],
                  running_version: str | None, target_version: str,
                  target_key: str) -> UpdateDecision:
    """What an update to `target_version` (image key `target_key`) does now (see
    UpdateDecision). A switch a crashed run left uncommitted is finished first, whatever the
    target: the run checks the version that run switched to."""
    running = running_version or UNVERSIONED_IMAGE
    if record is not None and switched(record):
        disk = str(record.get("to") or "")
        again = domain.get("disk") != disk
        return UpdateDecision(
            "finish", f"run {record.get('run') or '?'} switched the system disk to {disk} "
            f"(version {record.get('to_version')}) and never committed it: finishing that "
            "update" + (" (its switch is made again: the domain still uses its old disk)"
                        if again else ""),
            str(record.get("from_version") or running), str(record.get("to_version") or ""),
            disk, again)
    if running == target_version and domain.get("image_key") == target_key:
        return UpdateDecision("already", f"the VM runs version {target_version} (its grain) on "
                              f"image {target_key[:12]} (its system disk's base): nothing to do",
                              running, target_version)
    return UpdateDecision("update", f"the VM runs version {running} on image "
                          f"{str(domain.get('image_key') or '?')[:12]}; updating to "
                          f"{target_version} (image {target_key[:12]})", running, target_version)


def decide_revert(record: dict[str, Any] | None, store_id: str) -> Literal["revert", "already"]:
    """A manual revert: back to the record's previous system disk (a committed update within
    its keep time, or one a crashed run left switched), `already` when it was reverted."""
    if record is None:
        raise NothingToRevert(f"store {store_id}: its host holds no update record: no image "
                              "update switched its system disk, there is nothing to revert")
    return "already" if record.get("phase") == REVERTED else "revert"


def seconds_of(step_seconds: dict[str, float], steps: tuple[str, ...]) -> float | None:
    """How long the store was down over `steps` (None when the run did not go through them)."""
    if not any(step in step_seconds for step in steps):
        return None
    return round(sum(step_seconds.get(step, 0.0) for step in steps), 3)


def failed_check(step: str | None, error: BaseException) -> str:
    """The check that failed on the new version, and why, for the run's message."""
    what = CHECKS.get(step or "", step or "a step of the new version")
    return f"{what} failed: {str(error).strip() or type(error).__name__}"


def reverted_message(store_id: str, decision: UpdateDecision, check: str) -> str:
    # the outcome first: a batch's row keeps the first 300 characters of the message
    return (f"store {store_id}: image update to {decision.to_version} failed on the new "
            f"version and was reverted to {decision.from_version} (its go-live gate passes; "
            f"the ERP was not notified): {check}")


def update_notice_key(store_id: str, version: str) -> str:
    """The identity of the ERP's `store-image-updated` notice: one per store and version, so a
    rerun (or a resumed run) replays it instead of making a second one."""
    digest = hashlib.sha256(f"{store_id}/{ERP_STORE_IMAGE_UPDATED}/{version}".encode()
                            ).hexdigest()[:32]
    return f"store-rollout-{store_id}-{digest}"


def report(store_id: str, result: dict[str, Any]) -> str:
    """The run's markdown artifact: from/to version, downtime, each step or check."""
    seconds: dict[str, float] = result.get("step_seconds", {})
    failed = result.get("failed_check") or ""
    rows = "\n".join(f"| {step} | {CHECKS.get(step, '')} | {value} |"
                     for step, value in seconds.items())
    return (f"# Store {store_id} image {result.get('action', 'update')}\n\n"
            f"- outcome: **{result.get('outcome')}**\n"
            f"- from version: `{result.get('from_version')}`\n"
            f"- to version: `{result.get('to_version')}`\n"
            f"- downtime (shutdown to the minion back): {result.get('downtime_seconds')} s\n"
            + (f"- failed on the new version: {failed}\n" if failed else "")
            + (f"- revert downtime: {result.get('revert_downtime_seconds')} s\n"
               if result.get("revert_downtime_seconds") is not None else "")
            + f"\n| step | check | seconds |\n|---|---|---|\n{rows}\n")
