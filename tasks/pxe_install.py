"""Step 2, PXE install of a store's hypervisor: one task over three outside systems, Cobbler
(system record, netboot, sync), the host's BMC (network boot once, power cycle) and the Salt
master (the host's key and its one-time autosign token, and whether the host is already
installed and ready).

The clients are tasks/cobbler/, tasks/bmc/ and tasks/salt/; this module only composes them. The
record it writes (`system_spec`) and its install's power-on stamp (`power_cycled_at`) are
tasks/cobbler/systems.py's, the root password's hash tasks/root_password.py's: plan reads them
too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from prefect import get_run_logger, task

from store_rollout import data_disk, guard, step_rules
from store_rollout.contracts import POWER_CYCLED_META
from store_rollout.guard import NO_CONSENT, Action, Consent
from store_rollout.inventory import Store
from store_rollout.platforms import host_platform
from store_rollout.results import InstallResult, SilentHost
from store_rollout.settings_parts import (
    BmcSettings,
    CalendarSettings,
    CobblerSettings,
    HostSettings,
    SaltSettings,
)
from store_rollout.step_timeouts import STEP_TIMEOUTS
from tasks.bmc import Bmc, BmcUnreachable, bmc_client, power_cycle_for_install
from tasks.cobbler import (
    CobblerClient,
    CobblerRejected,
    CobblerUnavailable,
    cobbler_client,
    power_cycled_at,
    system_spec,
)
from tasks.notifications import announce_install_started
from tasks.retry import COBBLER_RETRY
from tasks.root_password import registration_code, store_root_password_hash
from tasks.run_health import run_started_at
from tasks.salt import hypervisor_ready, master_client
from tasks.salt.master_key import master_pin
from tasks.slots import fleet_slot
from tasks.windows import install_window


@task(name="pxe_install_hypervisor", **COBBLER_RETRY.on(CobblerUnavailable, BmcUnreachable))
def pxe_install_hypervisor(store: Store,
                           install_seconds: float = STEP_TIMEOUTS.hypervisor_timeout,
                           consent: Consent = NO_CONSENT,
                           window_covered: bool = False, *, salt: SaltSettings,
                           cobbler: CobblerSettings, power: BmcSettings, hosts: HostSettings,
                           calendar: CalendarSettings) -> InstallResult:
    """Step 2: Cobbler system record (upsert), netboot on, serialised sync of this system (a
    full sync would wipe the PXE configs of hypervisors booting right now), then through the
    host's BMC: network boot once and a power cycle. `install_seconds`: how long an install
    may take (step 3's timeout); within it a rerun leaves a host it powered on alone.

    What the host is comes from durable facts (step_rules.hypervisor_installed: its key
    accepted and its Cobbler record's finished install), not from one probe: an installed host
    that does not answer now is "silent" and left to step 3's wait, never installed again; one
    found powered off is powered on from its disk (through the guard). An installed host is
    reinstalled only when `consent` asks for it by name (reinstall_hypervisor), approved, in a
    window with room for steps 2 to 5 (store_rollout/guard.py), once per run
    (step_rules.reinstall_due). A host never installed is installed in a maintenance window
    with that room too (store_rollout/disruption.py), unless windows are overridden; outside
    one the step changes nothing and returns `window` (go false, until when to wait).
    `window_covered`: a replacement's retirement of the old box was let go by the guard with
    room for the whole sequence; the new box's install needs no second check.

    Returns an InstallResult (store_rollout/results.py): {"system", "created", "skipped",
    "silent", "install_underway", "power_actions", "window", "authorization"}; skipped when
    the hypervisor is installed and ready, which step 3 takes as its answer; silent when it
    is installed and does not answer ready now.
    """
    logger = get_run_logger()
    master = master_client(salt.salt_master_config)
    client = cobbler_client(cobbler)
    system = store.cobbler_system
    result = InstallResult(system=system, created=False, skipped=False, silent=False,
                           install_underway=False, power_actions=[], authorization=None)
    record = client.get_system(system)
    found = installed_already(store, master, record, consent.asks(Action.REINSTALL_HOST), logger,
                              hosts.vm_images_dir)
    if found == "installed":
        return {**result, "skipped": True}
    bmc = bmc_client(store, power)
    # asked before any change: a wrong BMC login or address fails here, having changed nothing
    powered_on = bmc.power_state() == "on"
    if found == "silent":
        return {**result, **wake_silent_host(store, calendar, bmc, powered_on, consent, logger)}
    cycled = power_cycled_at(record)
    # a ready host runs its last install: none is underway, whenever it began
    if found == "not installed" and step_rules.install_underway(
            cycled, datetime.now(UTC), install_seconds, powered_on):
        logger.info("store %s: %s was powered on into its install at %s and is on: no second "
                    "power cycle, step 3 waits for that install", store.store_id, system, cycled)
        return {**result, "install_underway": True}
    window, result["authorization"] = install_window(found == "reinstall", store, consent,
                                                     calendar, logger, window_covered)
    if not window["go"]:
        return {**result, "window": window}
    created, actions = reinstall(store, (salt, hosts, cobbler, power), master, client, bmc,
                                 record, logger)
    announce_install_started(store.store_id, store.hypervisor_minion_id,
                             hosts.hypervisor_ready_expected_seconds, install_seconds)
    return {**result, "created": created, "power_actions": actions, "window": window}


def wake_silent_host(store: Store, settings: CalendarSettings, bmc: Bmc, powered_on: bool,
                     consent: Consent, logger: Any) -> SilentHost:
    """An installed host that does not answer: left alone while its BMC says it is on (a WAN
    cut, a busy host, a minion restarting: step 3 waits for it); powered on, from its disk,
    when its BMC says it is off. Never reinstalled."""
    if powered_on:
        logger.warning("store %s: hypervisor %s is installed (key accepted, install finished "
                       "in Cobbler) but does not answer: silent, not reinstalled; step 3 waits "
                       "for it", store.store_id, store.hypervisor_minion_id)
        return {"silent": True}
    authorization = guard.authorize(Action.POWER_ON_HOST, store, consent,
                                    disruption_seconds=settings.disruption_seconds,
                                    default_calendar=settings.default_calendar)
    logger.warning("store %s: hypervisor %s is installed and powered off: powering it on from "
                   "its disk (not reinstalled); %s", store.store_id, store.hypervisor_minion_id,
                   guard.describe(authorization.record))
    bmc.power_on()
    return {"silent": True, "power_actions": ["on"], "authorization": authorization.record}


def installed_already(store: Store, master: Any, record: dict[str, Any] | None,
                      reinstall_asked: bool, logger: Any, images_dir: str = ""
                      ) -> Literal["installed", "silent", "not installed", "reinstall"]:
    """What step 2 has to do with the host: nothing ("installed": it answers ready, and no
    reinstall was asked for or this run did it already, step_rules.reinstall_due), wait for
    it ("silent": installed by the durable facts, not answering ready now), install it ("not
    installed"), or reinstall it as asked ("reinstall", still subject to the guard)."""
    minion = store.hypervisor_minion_id
    key = master.key_state(minion)
    recorded = step_rules.install_recorded(record is not None,
                                           None if record is None
                                           else bool(record.get("netboot_enabled")))
    answered: list[bool] = []

    def ready() -> bool:  # asked once, and only of an accepted key
        if not answered:
            answered.append(hypervisor_ready(master, minion))
        return answered[0]

    if not step_rules.hypervisor_installed(key, recorded, ready):
        return "not installed"
    if reinstall_asked and step_rules.reinstall_due(True, power_cycled_at(record),
                                                    run_started_at()):
        logger.warning("store %s: reinstalling hypervisor %s, installed, as asked: its disk "
                       "and the store server on it are wiped; %s", store.store_id, minion,
                       data_disk.lost_with_host(minion, data_disk.data_disk_path(
                           store, images_dir) if images_dir else None))
        return "reinstall"
    if not ready():
        return "silent"
    logger.info("store %s: hypervisor %s already installed and ready; no PXE%s", store.store_id,
                minion, " (reinstalled by this run already)" if reinstall_asked else "")
    return "installed"


def reinstall(store: Store,
              parts: tuple[SaltSettings, HostSettings, CobblerSettings, BmcSettings],
              master: Any, client: CobblerClient, bmc: Bmc, record: dict[str, Any] | None,
              logger: Any) -> tuple[bool, list[str]]:
    """Step 2's changes, in this order: a new key and token, the Cobbler record, its sync, then
    the BMC's network boot and power cycle. Returns (record created, power actions)."""
    salt, hosts, cobbler, power = parts
    minion, system = store.hypervisor_minion_id, store.cobbler_system
    platform = host_platform(store, hosts)
    profile = platform.profile_of(store)
    if not client.profile_exists(profile):
        raise CobblerRejected(f"store {store.store_id}: Cobbler profile {profile!r} does not "
                              "exist; create it or fix hypervisor.cobbler_profile")
    root_hash = store_root_password_hash(store, record)  # before any change: no Secret, no install
    code = registration_code(hosts.registration_code_block
                             if platform.needs_registration(hosts.sle16_product) else "")
    pin = master_pin(master.opts)  # as well: no master key, no install
    master.delete_key(minion)  # a stale key of a previous install would be 'denied'
    token = master.issue_token(minion)
    spec = system_spec(store, salt, hosts, token, root_hash, pin, registration_code=code)
    created = client.upsert_system(spec)
    logger.info("store %s: Cobbler system %s %s", store.store_id, system,
                "created" if created else "updated")
    with fleet_slot(cobbler.cobbler_sync_limit):
        client.sync_system(system)

    def mark_power_on() -> None:  # the evidence a rerun reads: written before the host is on
        # a running host's minion, until the power off, re-authenticated with its old key
        # (pending now): the new install's key would be refused as not matching it
        master.delete_key(minion)
        client.set_autoinstall_meta(system, {**spec.autoinstall_meta,
                                             POWER_CYCLED_META: datetime.now(UTC).isoformat()})

    actions = power_cycle_for_install(bmc, power.power_off_seconds, logger.info,
                                      before_on=mark_power_on)
    return created, actions
