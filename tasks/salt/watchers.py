"""The wait of step 3 on the master's event bus, as an object a task calls once (step 6's:
firstboot_watcher.py).

It takes the master (`MasterApi`), a logger and a clock: in a rollout Salt's client, the
Prefect run logger and the system clock; in a unit test a fake master with a scripted event
stream and a fake clock (tests/unit/tasks/test_salt_watchers.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from store_rollout import step_rules
from store_rollout.contracts import (
    AUTOSIGN_REFUSED_TAG,
    HYPERVISOR_READY_TAG,
)
from tasks.salt.errors import (
    HypervisorKeyContested,
    HypervisorMinionRefused,
    HypervisorWrongHardware,
    SaltEventTimeout,
)
from tasks.salt.events import SYSTEM_CLOCK, Clock, SaltEvent, next_event
from tasks.salt.masterlog import AuthRefusal
from tasks.salt.probes import (
    MasterApi,
    contested_key,
    hardware_serial,
    hypervisor_state,
    reapply_highstate,
)

Logger = logging.Logger | logging.LoggerAdapter
T = TypeVar("T")
STATE_FUNS = {"state.sls", "state.apply", "state.highstate"}
# after an event claims a minion's progress, its own answer is asked at once and then a little
# later (a grain set by the state before the event may reach the minion's memory a moment after)
CONFIRM_PAUSES = (0.0, 0.5, 1.5)


def confirmed(clock: Clock, ask: Callable[[], T], agrees: Callable[[T], bool]) -> tuple[bool, T]:
    """Whether the minion's own answer (`ask`) `agrees` with what an event claimed, asked over
    CONFIRM_PAUSES; with the last answer."""
    answer = ask()
    for pause in CONFIRM_PAUSES[1:]:
        if agrees(answer):
            return True, answer
        clock.sleep(pause)
        answer = ask()
    return agrees(answer), answer


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
        self.refusals: list[AuthRefusal] = []

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
                if self.refusals and key != step_rules.KEY_ACCEPTED:
                    raise HypervisorMinionRefused(self.store_id, self.refusals[-1],
                                                  self.master.master_config)
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
                        claimed = next_event(
                            bus, self._is_ready_event, what=HYPERVISOR_READY_TAG,
                            timeout=min(10.0, max(0.1, deadline - self.clock.monotonic())),
                            seen=self._seen, clock=self.clock)
                        ready = self._confirm_ready(claimed)
                    except SaltEventTimeout:
                        ready = self._check()
                return ready
        except (SaltEventTimeout, HypervisorMinionRefused, HypervisorKeyContested):
            raise
        except Exception as exc:  # the master's bus went away (restart): subscribe again
            self.logger.warning("store %s: event bus lost (%s); resubscribing", self.store_id, exc)
            self.clock.sleep(1)
            return False

    def _confirm_ready(self, claimed: SaltEvent) -> bool:
        """A ready event is only a hint: its `id` is the sender's word (any accepted minion can
        fire it). The host's own ready grain, read through the job cache, decides."""
        ready, state = confirmed(self.clock, lambda: hypervisor_state(self.master, self.minion),
                                 lambda answer: answer == "ready")
        if ready:
            return True
        self.logger.warning(
            "store %s: a %s event claiming to come from %s was not confirmed by %s itself (it "
            "answers: %s): another minion forged it; ignored (event data: %s)", self.store_id,
            claimed.tag, self.minion, self.minion, state, str(claimed.data)[:200])
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
        for refusal in self.master_log.auth_refusals(self.minion):
            if refusal not in self.refusals:
                self.logger.warning(
                    "store %s: the master refused a sign-in as %s with auth protocol %d (it "
                    "requires %d): the host's salt-minion is too old, or a machine on the store "
                    "network claims its id (a sign-in needs no key); waiting on for the host",
                    self.store_id, self.minion, refusal.version, refusal.minimum)
            self.refusals.append(refusal)
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
