"""The waits of steps 3 and 6 on the master's event bus, as objects a task calls once.

Each takes the master (`MasterApi`), a logger and a clock: in a rollout Salt's client, the
Prefect run logger and the system clock; in a unit test a fake master with a scripted event
stream and a fake clock (tests/test_salt_watchers.py).
"""

from __future__ import annotations

import logging
from typing import Any

from store_rollout import step_rules
from store_rollout.contracts import (
    AUTOSIGN_REFUSED_TAG,
    FIRSTBOOT_EVENT_DONE,
    FIRSTBOOT_EVENT_PREFIX,
    HYPERVISOR_READY_TAG,
)
from store_rollout.inventory import Store
from tasks.salt.errors import (
    FirstbootFailed,
    HypervisorKeyContested,
    HypervisorMinionRefused,
    HypervisorWrongHardware,
    SaltEventTimeout,
    VmNeverContacted,
)
from tasks.salt.events import SYSTEM_CLOCK, Clock, SaltEvent, next_event
from tasks.salt.minions import failed_states
from tasks.salt.probes import (
    MasterApi,
    contested_key,
    firstboot_stage,
    hardware_serial,
    hypervisor_state,
    reapply_highstate,
    reset_vm,
)

Logger = logging.Logger | logging.LoggerAdapter
STATE_FUNS = {"state.sls", "state.apply", "state.highstate"}


def _describe(event: SaltEvent | None) -> str:
    if event is None:
        return "none"
    detail = {k: event.data.get(k) for k in ("act", "fun", "retcode") if k in event.data}
    return f"{event.tag} {detail or ''}".strip()


class HypervisorReadyWatcher:
    """Step 3: the hypervisor's ready event (last state of its highstate), or its ready grain.

    Subscribes first, then checks the current state, so an event fired before subscribing is
    not missed; the grain is checked again every few seconds and after each resubscription
    (a master restart loses events). A hypervisor that has answered for `stall_timeout` seconds
    without getting ready and runs no state has its highstate applied again, once. Fails at
    once when the master log shows it refusing the minion's auth protocol, or when two keys
    claim the minion's id. Once ready, the one-time autosign token is revoked, and a host
    whose SMBIOS serial is not `serial` (the inventory's, when it gives one) fails: nothing more
    is done on another box than the store's."""

    def __init__(self, master: MasterApi, store_id: str, minion: str, *, timeout: float,
                 stall_timeout: float, logger: Logger, clock: Clock = SYSTEM_CLOCK,
                 serial: str | None = None) -> None:
        self.master, self.store_id, self.minion, self.serial = master, store_id, minion, serial
        self.timeout, self.stall_timeout = timeout, stall_timeout
        self.logger, self.clock = logger, clock
        self.last: SaltEvent | None = None
        self.answering_since: float | None = None
        self.silent_since: float | None = None  # since when it has not answered at all
        self.reapplied: str | None = None
        self.master_log = master.log_tail()

    def wait(self, already_ready: bool = False) -> dict[str, Any]:
        """`already_ready`: step 2 found the hypervisor ready a moment ago (a rerun) and skipped
        the install; that answer stands and no second probe is made."""
        started = self.clock.monotonic()
        deadline = started + self.timeout
        ready = already_ready
        while not ready:
            ready = self._listen(deadline)
            if not ready and self.clock.monotonic() >= deadline:
                key = self.master.key_state(self.minion)
                silent = ""
                if self.silent_since is not None and key == step_rules.KEY_ACCEPTED:
                    silent = (f"; silent for {self.clock.monotonic() - self.silent_since:.0f}s: "
                              "its key is accepted, so it is waited for, never reinstalled "
                              "(check its power, network and salt-minion, then run again)")
                raise SaltEventTimeout(
                    f"store {self.store_id}: hypervisor minion {self.minion} sent no "
                    f"{HYPERVISOR_READY_TAG} within {self.timeout:.0f}s; last event from it: "
                    f"{_describe(self.last)}; key state: {key}{silent}",
                    operation=HYPERVISOR_READY_TAG, minion_id=self.minion, timeout=self.timeout)
        # a ready event proves nothing about whose key sent it: look once more at the keys
        contested_key(self.master, self.store_id, self.minion)
        if self.clock.monotonic() - started < 0.5:
            self.logger.info("store %s: hypervisor %s already ready", self.store_id, self.minion)
        revoked = self.master.revoke_token(self.minion)
        self.logger.info("store %s: hypervisor %s ready after %.1fs (token revoked: %s)",
                         self.store_id, self.minion, self.clock.monotonic() - started, revoked)
        return {"minion": self.minion,
                "waited_seconds": round(self.clock.monotonic() - started, 3),
                "highstate_reapplied": self.reapplied, "serial": self._check_hardware()}

    def _check_hardware(self) -> str | None:
        """The host's serial, checked against the inventory's (None: the inventory gives none,
        and the host is not asked)."""
        if self.serial is None:
            return None
        reported = hardware_serial(self.master, self.minion)
        if not step_rules.hardware_matches(self.serial, reported):
            raise HypervisorWrongHardware(self.store_id, self.minion, self.serial, reported)
        self.logger.info("store %s: hypervisor %s is the store's box (serial %s)",
                         self.store_id, self.minion, reported)
        return reported

    def _listen(self, deadline: float) -> bool:
        """One subscription: ready, or the deadline passed, or the bus went away (False)."""
        # the event is the fast path; the ready grain, checked after (re)subscribing and every
        # few seconds, covers events fired before we listened or lost in a master restart
        try:
            with self.master.subscribe("") as bus:
                ready = self._check()
                while not ready and self.clock.monotonic() < deadline:
                    try:
                        next_event(bus, self._is_ready_event, what=HYPERVISOR_READY_TAG,
                                   timeout=min(10.0, max(0.1, deadline - self.clock.monotonic())),
                                   seen=self._seen, clock=self.clock)
                        ready = True
                    except SaltEventTimeout:
                        ready = self._check()
                return ready
        except (SaltEventTimeout, HypervisorMinionRefused, HypervisorKeyContested):
            raise
        except Exception as exc:  # the master's bus went away (restart): subscribe again
            self.logger.warning("store %s: event bus lost (%s); resubscribing", self.store_id, exc)
            self.clock.sleep(1)
            return False

    def _is_ready_event(self, event: SaltEvent) -> bool:
        return event.tag == HYPERVISOR_READY_TAG and event.minion == self.minion

    def _seen(self, event: SaltEvent) -> None:
        if event.minion == self.minion or event.tag.startswith(f"salt/minion/{self.minion}/"):
            self.last = event
        if event.tag == AUTOSIGN_REFUSED_TAG and event.data.get("token_of") == self.minion:
            self.logger.warning(
                "store %s: minion %r signed in with hypervisor %s's one-time token (key %s) and "
                "was removed by the master's autosign guard: someone on the store network read "
                "the install profile", self.store_id, event.data.get("id"), self.minion,
                event.data.get("fingerprint"))

    def _check(self) -> bool:
        """The current state: refused or contested fails; a stalled one gets its highstate."""
        refused = self.master_log.auth_refusals(self.minion)
        if refused:
            raise HypervisorMinionRefused(self.store_id, refused[-1], self.master.master_config)
        contested_key(self.master, self.store_id, self.minion)
        state = hypervisor_state(self.master, self.minion)
        now = self.clock.monotonic()
        self.answering_since = None if state == "silent" else self.answering_since or now
        self.silent_since = (self.silent_since or now) if state == "silent" else None
        up_for = now - (self.answering_since or now)
        if state == "answering" and self.reapplied is None and up_for >= self.stall_timeout:
            self.reapplied = reapply_highstate(self.master, self.minion)
            if self.reapplied:
                self.logger.warning(
                    "store %s: hypervisor %s up for %.0fs but not ready and running no state; "
                    "highstate applied again (job %s)", self.store_id, self.minion, up_for,
                    self.reapplied)
        return state == "ready"


class FirstbootWatcher:
    """Step 6: the store VM through `provisioning_helper.firstboot`, judged by the VM itself.

    Follows stage events `store/vm/firstboot/{started,highstate,report,done}` from the VM's
    minion, its (re)starts and the returns of its state runs, failing fast with the failing
    states' ids and comments. Its `firstboot_stage` grain is checked after subscribing and
    after every (re)start of its minion. A VM whose accepted minion stays silent for
    `stall_timeout` (hung after a reboot) is reset once. A VM whose minion never contacts the
    master (no key, no event) within `contact_timeout` fails at once, naming the master
    address the image was built with (`master_endpoint`): no wait for the whole `timeout`."""

    def __init__(self, master: MasterApi, store: Store, *, timeout: float, stall_timeout: float,
                 contact_timeout: float, master_endpoint: tuple[str, str], logger: Logger,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.master, self.store, self.minion = master, store, store.vm_minion_id
        self.timeout, self.stall_timeout = timeout, stall_timeout
        self.contact_timeout, self.master_endpoint = contact_timeout, master_endpoint
        self.logger, self.clock = logger, clock
        self.started = self.last_seen = clock.monotonic()
        self.stages: dict[str, float] = {}
        self.boot_ids: dict[str, str] = {}
        self.minion_starts: list[float] = []
        self.last: SaltEvent | None = None
        self.token_revoked = False
        self.resets = 0

    def wait(self) -> dict[str, Any]:
        """Until the VM's firstboot is done; its token is revoked once its key is accepted.
        Returns each stage event's and minion start's time (seconds into the wait) and the
        kernel's boot id each stage ran under: two reboots show as three boot ids."""
        self.started = self.last_seen = self.clock.monotonic()
        deadline = self.started + self.timeout
        with self.master.subscribe("") as bus:
            self._revoke_once()
            done = step_rules.firstboot_done(firstboot_stage(self.master, self.minion))
            contacted = done or self.master.key_state(self.minion) is not None
            while not done:
                contacted = contacted or self.last is not None
                self._fail_if_never_contacted(contacted)
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    raise SaltEventTimeout(
                        f"store {self.store.store_id}: VM minion {self.minion} did not finish "
                        f"firstboot within {self.timeout:.0f}s; stages seen: "
                        f"{list(self.stages) or 'none'}; last event from it: "
                        f"{self.last.tag if self.last else 'none'}; resets: {self.resets}",
                        operation="firstboot", minion_id=self.minion, timeout=self.timeout)
                try:
                    next_event(bus, self._relevant, timeout=min(remaining, 5), what="firstboot",
                               clock=self.clock)
                    done = True
                except SaltEventTimeout:
                    self._reset_if_stalled()
        self._revoke_once()
        return {"minion": self.minion, "stages": self.stages, "boot_ids": self.boot_ids,
                "minion_starts": self.minion_starts, "boots_seen": len(self.minion_starts),
                "resets": self.resets}

    def _since_start(self) -> float:
        return round(self.clock.monotonic() - self.started, 3)

    def _revoke_once(self) -> None:
        if not self.token_revoked and self.master.key_state(self.minion) == "accepted":
            self.token_revoked = self.master.revoke_token(self.minion) or True

    def _relevant(self, event: SaltEvent) -> bool:
        """Records an event of this VM's minion; True when firstboot is done."""
        minion = self.minion
        if event.minion != minion and not event.tag.startswith(f"salt/minion/{minion}/"):
            return False
        self.last, self.last_seen = event, self.clock.monotonic()
        if event.tag == f"salt/minion/{minion}/start":
            self.minion_starts.append(self._since_start())
            self._revoke_once()
            return step_rules.firstboot_done(firstboot_stage(self.master, minion))
        if event.tag.startswith(FIRSTBOOT_EVENT_PREFIX):
            stage = event.tag[len(FIRSTBOOT_EVENT_PREFIX):]
            self.stages[stage] = self._since_start()
            if event.payload.get("boot_id"):
                self.boot_ids[stage] = str(event.payload["boot_id"])
            self.logger.info("store %s: firstboot stage %s", self.store.store_id, stage)
            return stage == FIRSTBOOT_EVENT_DONE
        if (event.tag.startswith("salt/job/") and event.data.get("fun") in STATE_FUNS
                and int(event.data.get("retcode", 0) or 0) != 0):
            ret = event.data.get("return")
            raise FirstbootFailed(self.store.store_id, minion, failed_states(ret), str(ret)[:500])
        return False

    def _fail_if_never_contacted(self, contacted: bool) -> None:
        if (not contacted and self.clock.monotonic() - self.started > self.contact_timeout
                and self.master.key_state(self.minion) is None):
            address, port = self.master_endpoint
            raise VmNeverContacted(self.store.store_id, self.minion, self.contact_timeout,
                                   master_address=address, master_port=port,
                                   vm_name=self.store.vm_name,
                                   hypervisor=self.store.hypervisor_minion_id)

    def _reset_if_stalled(self) -> None:
        """Reset, once, a VM whose accepted minion has been silent for `stall_timeout`."""
        silent = self.clock.monotonic() - self.last_seen
        if (silent > self.stall_timeout and self.resets == 0
                and self.master.key_state(self.minion) == "accepted"
                and firstboot_stage(self.master, self.minion) is None):
            self.logger.warning("store %s: VM minion %s silent for %.0fs; resetting the VM",
                                self.store.store_id, self.minion, silent)
            reset_vm(self.master, self.store.hypervisor_minion_id, self.store.vm_name)
            self.resets += 1
            self.last_seen = self.clock.monotonic()
