"""The wait of step 6 on the master's event bus, as an object the task calls once.

Like step 3's watcher (tasks/salt/watchers.py) it takes the master (`MasterApi`), a logger and a
clock, so a unit test drives it over a scripted event stream
(tests/unit/tasks/test_salt_watchers.py). Events are hints: what the VM's key returned (its grain,
its state runs, read through the master's job cache) decides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from store_rollout import step_rules
from store_rollout.contracts import FIRSTBOOT_EVENT_DONE, FIRSTBOOT_EVENT_PREFIX
from store_rollout.inventory import Store
from tasks.salt.errors import FirstbootFailed, SaltEventTimeout, VmNeverContacted
from tasks.salt.events import SYSTEM_CLOCK, Clock, SaltEvent, next_event
from tasks.salt.minions import failed_states
from tasks.salt.probes import MasterApi, contested_key, firstboot_stage, reset_vm
from tasks.salt.watchers import STATE_FUNS, Logger, confirmed

# seconds the VM is silent before the wait asks whether its store's link is down (and between
# two such questions): a VM's reboot is silent too, its hypervisor answers meanwhile
LINK_CHECK_SECONDS = 15.0


class FirstbootWatcher:
    """Step 6: the store VM through `provisioning_helper.firstboot`, judged by the VM itself.

    Follows stage events `store/vm/firstboot/{started,highstate,report,done}` from the VM's
    minion, its (re)starts and the returns of its state runs, failing fast with the failing
    states' ids and comments. Its `firstboot_stage` grain is checked after subscribing and
    after every (re)start of its minion. A VM whose accepted minion stays silent for
    `stall_timeout` (hung after a reboot) is reset once. A VM whose minion never contacts the
    master (no key, no event) within `contact_timeout` fails at once, naming the master
    address the image was built with (`master_endpoint`): no wait for the whole `timeout`.
    `link` (tasks/store_link.StoreLink.hold): asked when the VM has been silent a while; it
    waits out a store whose link is down (the time it waited extends the step's bounds),
    after which the VM's stage is read again (its events meanwhile were lost)."""

    def __init__(self, master: MasterApi, store: Store, *, timeout: float, stall_timeout: float,
                 contact_timeout: float, master_endpoint: tuple[str, str], logger: Logger,
                 clock: Clock = SYSTEM_CLOCK, link: Callable[[float], float] | None = None) -> None:
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
        self.link, self.link_waited, self.link_checked = link, 0.0, clock.monotonic()
        # when the VM's time to first call the master started (again, after a link outage)
        self.contact_from, self.contact_link_base = self.started, 0.0

    def wait(self) -> dict[str, Any]:
        """Until the VM's firstboot is done; its token is revoked once its key is accepted.
        Returns each stage event's and minion start's time (seconds into the wait) and the
        kernel's boot id each stage ran under: two reboots show as three boot ids."""
        self.started = self.last_seen = self.contact_from = self.clock.monotonic()
        deadline = self.started + self.timeout
        with self.master.subscribe("") as bus:
            self._contested()
            self._revoke_once()
            done = step_rules.firstboot_done(firstboot_stage(self.master, self.minion))
            contacted = done or self.master.key_state(self.minion) is not None
            while not done:
                contacted = contacted or self.last is not None
                self._fail_if_never_contacted(contacted)
                remaining = deadline + self.link_waited - self.clock.monotonic()
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
                    self._contested()
                    done = self._after_link_outage()
                    self._reset_if_stalled()
        self._contested()  # done: said by an accepted key, and the only key of the id
        self._revoke_once()
        return {"minion": self.minion, "stages": self.stages, "boot_ids": self.boot_ids,
                "minion_starts": self.minion_starts, "boots_seen": len(self.minion_starts),
                "resets": self.resets}

    def _after_link_outage(self) -> bool:
        """When the VM has been silent a while, its store's link is asked about (`link`); after
        an outage the wait goes on with its bounds moved by it, and True when the VM's stage
        says firstboot finished meanwhile."""
        now = self.clock.monotonic()
        silent = now - self.last_seen
        if (self.link is None or silent < LINK_CHECK_SECONDS
                or now - self.link_checked < LINK_CHECK_SECONDS):
            return False
        return self._link_waited(silent) and step_rules.firstboot_done(
            firstboot_stage(self.master, self.minion))

    def _link_waited(self, silent: float) -> bool:
        """The store's link asked now (`link`): True when it was down and has been waited out
        (the step's bounds move by the outage)."""
        if self.link is None:
            return False
        waited = self.link(silent)
        self.link_checked = self.clock.monotonic()
        if not waited:
            return False
        self.link_waited += waited
        self.last_seen = self.clock.monotonic()
        return True

    def _contested(self) -> None:
        contested_key(self.master, self.store.store_id, self.minion, role="VM")

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
            return stage == FIRSTBOOT_EVENT_DONE and self._confirm_done(event)
        if (event.tag.startswith("salt/job/") and event.data.get("fun") in STATE_FUNS
                and int(event.data.get("retcode", 0) or 0) != 0):
            self._fail_if_its_key_says_so(event)
        return False

    def _confirm_done(self, claimed: SaltEvent) -> bool:
        """A done event is only a hint (any accepted minion can fire one claiming this VM's id):
        the VM's own firstboot_stage grain, read through the job cache, decides."""
        done, stage = confirmed(self.clock, lambda: firstboot_stage(self.master, self.minion),
                                step_rules.firstboot_done)
        if done:
            return True
        self.logger.warning(
            "store %s: a %s event claiming to come from %s was not confirmed by %s itself (its "
            "firstboot stage: %s): another minion forged it; ignored", self.store.store_id,
            claimed.tag, self.minion, self.minion, stage)
        return False

    def _fail_if_its_key_says_so(self, event: SaltEvent) -> None:
        """A failed state run on the bus fails the step only when the VM's key returned it."""
        jid = event.tag.split("/")[2]
        held = self.master.job_return(jid, self.minion)
        if held is not None and int(held.get("retcode", 0) or 0) != 0:
            ret = held.get("return")
            raise FirstbootFailed(self.store.store_id, self.minion, failed_states(ret),
                                  str(ret)[:500])
        self.logger.warning(
            "store %s: a failed %s return of job %s claiming to come from %s is not the one its "
            "key sent (the master's job cache: %s): another minion forged it; ignored",
            self.store.store_id, event.data.get("fun"), jid, self.minion,
            "none" if held is None else f"retcode {held.get('retcode', 0)}")

    def _fail_if_never_contacted(self, contacted: bool) -> None:
        now = self.clock.monotonic()
        waited = now - self.contact_from - (self.link_waited - self.contact_link_base)
        if not contacted and waited > self.contact_timeout \
                and self.master.key_state(self.minion) is None:
            if self._link_waited(now - self.last_seen):
                # a cut since the last link check is no VM that never called (review): once
                # the link is back, the VM gets a whole contact_timeout to call
                self.contact_from, self.contact_link_base = (self.clock.monotonic(),
                                                             self.link_waited)
                return
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
                and firstboot_stage(self.master, self.minion) is None
                # asked right before: a store cut off since its last check is waited for, and
                # a VM never reset through a host that cannot be reached (review)
                and not self._link_waited(silent)):
            self.logger.warning("store %s: VM minion %s silent for %.0fs; resetting the VM",
                                self.store.store_id, self.minion, silent)
            reset_vm(self.master, self.store.hypervisor_minion_id, self.store.vm_name)
            self.resets += 1
            self.last_seen = self.clock.monotonic()
