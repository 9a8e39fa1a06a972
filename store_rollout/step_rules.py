"""Each step's "already done" rule, written once: the tasks act on it, plan and reconcile
(store_rollout/fleet/) predict with it, so a rerun does what the plan said it would.

Pure functions of plain facts: a key state as `key.list_all` names it, a domain as
`storevirt.domain_summary` describes it (None: no domain), a firstboot stage grain, the ERP's
notices. Callers reach them as `step_rules.<name>` (never `from ... import`), so that
tests/unit/store_rollout/test_step_rules.py can swap one and see both sides follow.

A fact that costs a call to a host may be passed as a callable: it is called only when the
rule needs it (an unaccepted minion is never asked for a grain, which would wait out a timeout).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeGuard, TypeVar

from store_rollout.contracts import ERP_STORE_DECOMMISSIONED, FIRSTBOOT_STAGE_DONE

T = TypeVar("T")
Domain = dict[str, Any] | None  # storevirt.domain_summary's answer

KEY_ACCEPTED = "accepted"


def _now(fact: T | Callable[[], T]) -> T:
    return fact() if callable(fact) else fact


def install_recorded(record_exists: bool, netboot: bool | None) -> bool:
    """What the store's Cobbler record durably says of its host: an install ran to its end
    (the installer's end-of-install call turned netboot off, `pxe_just_once`) and no new one
    was asked for since (step 2 turns netboot on before it powers the host into an install;
    a rollback leaves it off)."""
    return record_exists and netboot is False


def hypervisor_installed(key_state: str | None, recorded: bool,
                         ready: bool | Callable[[], bool]) -> bool:
    """Step 2 never installs this host unless a reinstall was asked for: its key is accepted
    and either its Cobbler record says its install finished (`install_recorded`: durable, so a
    host that does not answer now is "silent", not "not installed") or it answers with its
    highstate's ready grain set (a host of an older record). One unanswered probe never makes
    a live store's host "not installed"."""
    return key_state == KEY_ACCEPTED and (recorded or bool(_now(ready)))


def hardware_matches(expected_serial: str | None, reported_serial: str | None) -> bool:
    """Step 3 goes on with the installed host (and reconcile calls it the store's box): the
    inventory names no serial, or the host's SMBIOS reports that one (case and surrounding blanks
    aside, as labels and firmware differ in both)."""
    if expected_serial is None:
        return True
    return (reported_serial or "").strip().casefold() == expected_serial.strip().casefold()


def reinstall_due(installed: bool, power_cycled_at: datetime | None,
                  requested_at: datetime) -> bool:
    """Step 2 reinstalls a host that is installed and ready, as the run was asked to
    (`reinstall_hypervisor`), unless it already powered the host on into an install since the
    request (the same run again: a retry, or resumed after it was parked)."""
    return installed and (power_cycled_at is None or power_cycled_at < requested_at)


def install_underway(power_cycled_at: datetime | None, now: datetime, install_seconds: float,
                     powered_on: bool | Callable[[], bool]) -> bool:
    """Step 2 leaves the host alone (no new token, no record change, no power cycle) and step 3
    waits for it: an earlier attempt powered it on into its install less than `install_seconds`
    ago (step 3's timeout) and it is still on. A second power cycle would cut that install off."""
    if power_cycled_at is None or not 0 <= (now - power_cycled_at).total_seconds() < install_seconds:
        return False
    return bool(_now(powered_on))


def vm_key_kept(domain: Domain,
                key_state: str | None | Callable[[], str | None]) -> bool:
    """Step 4 keeps the VM's key (no delete, no new token): the domain exists (a rerun, or a VM
    merely down now) and the key it was accepted with is still accepted. A key is stale only
    when its VM is going to be created anew."""
    return domain_reusable(domain) and _now(key_state) == KEY_ACCEPTED


def domain_reusable(domain: Domain) -> TypeGuard[dict[str, Any]]:
    """Step 5 reuses the store's domain as it is (no image transfer, no new overlay, whatever
    base image its disk is on: moving it is a rollback's job) when one exists."""
    return domain is not None


def seed_needed(domain: Domain, vm_minion: str) -> bool:
    """Step 5 writes the identity seed: a fresh domain, or one whose creation was interrupted
    before its seed named this minion."""
    return domain is None or (domain.get("seed") or {}).get("minion_id") != vm_minion


def start_needed(domain: Domain) -> bool:
    """Step 5 starts the domain: it is not running."""
    return domain is None or not domain.get("active")


def firstboot_done(stage: str | None) -> bool:
    """Step 6 is over: the VM's firstboot stage grain says so (None: the VM does not answer)."""
    return stage == FIRSTBOOT_STAGE_DONE


def erp_idempotency_key(store_id: str, vm_uuid: str) -> str:
    """Step 7's notice identity: same store and same VM instance, same key, so the ERP replays
    a rerun's notice instead of making a second one; a new VM (new uuid) gets a new notice."""
    digest = hashlib.sha256(f"{store_id}/{vm_uuid}".encode()).hexdigest()[:32]
    return f"store-rollout-{store_id}-{digest}"


def erp_notice_for(notices: list[dict[str, Any]], vm_uuid: str | None) -> dict[str, Any] | None:
    """The ERP's notice for the VM with this uuid (step 7 would replay it), or None: a notice
    of an earlier VM of the store does not count (its idempotency key has another uuid)."""
    return next((n for n in notices if vm_uuid and n.get("vm_uuid") == vm_uuid), None)


def decommissioned(notices: list[dict[str, Any]]) -> bool:
    """The store is closed: its newest ERP notice (the ERP lists them oldest first) says so. A
    store rolled out again after its decommission has a newer notice, and counts again."""
    return bool(notices) and notices[-1].get("status") == ERP_STORE_DECOMMISSIONED


def store_live(notices: list[dict[str, Any]]) -> bool:
    """The store went live and was not closed since: the ERP holds a notice of it (a running
    store server, or its box replaced) and the newest is not its decommission. A cancelled run
    never cleans up after such a store."""
    return bool(notices) and not decommissioned(notices)


def box_notice_key(store_id: str, kind: str, hypervisor_mac: str) -> str:
    """The identity of a notice about a store's box (`kind`: decommissioned, replaced): one
    per store, kind and box, so a rerun replays it."""
    digest = hashlib.sha256(f"{store_id}/{kind}/{hypervisor_mac}".encode()).hexdigest()[:32]
    return f"store-rollout-{store_id}-{digest}"


def old_box_retired(record_macs: list[str], new_mac: str) -> bool:
    """A replacement's old box needs nothing more (a rerun): the store's Cobbler record holds
    the new box's MAC, which step 2 wrote after the old box was retired."""
    return new_mac.lower() in [str(mac).lower() for mac in record_macs]
