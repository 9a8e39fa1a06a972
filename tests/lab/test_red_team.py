"""Issue 44, the red team: one store's accepted minion against another store.

Store B's minion signs in with its own key, as a store server does after its rollout; then,
as root on B would, it sends the master what any accepted minion can send (`salt-call
event.fire_master` with a batch preload: each event is fired as B wrote it, `id` included).
Each attack aims at store A, whose minions are real lab minions too. The pipeline's own code
judges each one (the reactor and the autosign guard in the lab's master; the waits of steps 3
and 6 and the go-live gate's call with Salt's real client): each attack fails, store A's keys
are as they were, and the step's log names the attempt. Two attacks need no key at all (a
machine on the store network): a sign-in with auth protocol 2 as A's host, and a second key
for A's VM id.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.simulator.minions import MinionManager
from lab.state import HOST_PY36_SALT_BIN, VENV_BIN, LabInfo, LabPaths
from lab.store_network import StoreNetwork
from store_rollout.contracts import (
    AUTOSIGN_FORGED_TAG,
    AUTOSIGN_GRAIN,
    FIRSTBOOT_EVENT_DONE,
    FIRSTBOOT_EVENT_PREFIX,
    FIRSTBOOT_STAGE_GRAIN,
    GO_LIVE_FUNCTION,
    HYPERVISOR_READY_GRAIN,
    HYPERVISOR_READY_TAG,
    ROLLOUT_PROGRESS_TAG,
    STORE_SERVER_CONFIG,
)
from store_rollout.inventory import Store
from tasks.salt import (
    FirstbootWatcher,
    HypervisorReadyWatcher,
    MinionKeyContested,
    SaltEvent,
    SaltEventTimeout,
    SaltMasterClient,
    SaltMinionNoResponse,
)
from tests.helpers import wait_for

# one fleet for the module, on one worker: the attacks run in this order (tests/durations.json
# gives them one value, so the longest-first sort keeps it; the VM-id race comes last)
pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("red_team")]
RUN = secrets.token_hex(2)
A, B = f"rta{RUN}", f"rtb{RUN}"
A_HV, A_VM, B_VM = f"store-{A}-hv", f"store-{A}-vm", f"store-{B}-vm"
PASSING_GATE = [{"check": "pos service", "kind": "service", "passed": True,
                 "observed": "active", "expected": "active"}]


class Step(logging.Handler):
    """A step's log, as the rollout's run log would hold it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.logger = logging.getLogger(f"red-team.{secrets.token_hex(3)}")
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def names(self, *words: str) -> bool:
        return any(all(w in line for w in words) for line in self.lines)


class Fleet:
    """Store A's host and server and store B's server: lab minions signed in with one-time
    tokens like the real ones, and what an attacker runs beside them."""

    def __init__(self, lab: LabInfo, tmp: Path) -> None:
        self.lab, self.tmp = lab, tmp
        self.master = SaltMasterClient(lab.salt_master_config)
        self.minions = MinionManager(LabPaths(Path(lab.state_dir)), lab)
        self.network = StoreNetwork.load(Path(lab.store_network_state))

    def sign_in(self, *ids: str) -> None:
        for minion in ids:
            token = self.master.issue_token(minion)
            conf = {"master": self.network.gateway, "id": minion,
                    "grains": {AUTOSIGN_GRAIN: token}, "autosign_grains": [AUTOSIGN_GRAIN]}
            self.minions.install(minion, {"50-store-rollout.conf": yaml.safe_dump(conf)}, {})
            self.minions.start(minion, "red team: a store's machine")
        wait_for(lambda: all(self.master.key_state(m) == "accepted" for m in ids), timeout=60,
                 what=f"{ids} accepted")
        wait_for(lambda: all(self.master.ping(m) for m in ids), timeout=30, what=f"{ids} answer")

    def renew(self, minion: str) -> None:
        """`minion` signed in again from scratch (a new key, no grains): after a test that
        took its key away, the next test finds it as the fleet began (tests run in any order)."""
        self.forget(minion)
        self.sign_in(minion)

    def forget(self, minion: str) -> None:
        """`minion` stopped, its key deleted, its directory (key pair, grains) removed."""
        self.minions.stop(minion, "red team: done with it")
        self.master.delete_key(minion)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.minions.minion_dir(minion))

    def keys(self) -> dict[str, str | None]:
        return {m: self.master.key_state(m) for m in (A_HV, A_VM, B_VM)}

    def as_b(self, *events: tuple[str, dict[str, Any]]) -> None:
        """Root on store B's server: a batch of events to the master, signed in with B's key."""
        preload = json.dumps({"events": [{"tag": t, "data": d} for t, d in events]})
        done = self.network.run(
            [str(VENV_BIN / "salt-call"), "-c", str(self.minions.minion_dir(B_VM) / "etc"),
             "--out=json", "event.fire_master", "{}", "red/team", f"preload={preload}"],
            capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0 and "true" in done.stdout, done.stdout + done.stderr

    def stranger(self, minion: str, salt_bin: Path, fun: str = "test.ping") -> str:
        """A machine on the store network with no accepted key, claiming `minion`: one
        salt-call (its key is made anew), whatever the master says to it."""
        root = self.tmp / f"stranger-{secrets.token_hex(3)}"
        for sub in ("etc", "pki", "c", "s"):  # Salt 3006.0 wants its pki dir made
            (root / sub).mkdir(parents=True)
        ports = yaml.safe_load((self.minions.minion_dir(B_VM) / "etc" / "minion.d" /
                                "zz-lab-hardware.conf").read_text())
        (root / "etc" / "minion").write_text(yaml.safe_dump({
            "id": minion, "master": self.network.gateway, "master_port": ports["master_port"],
            "publish_port": ports["publish_port"], "root_dir": str(root), "user": "root",
            "pki_dir": str(root / "pki"), "cachedir": str(root / "c"),
            "sock_dir": str(root / "s"), "log_file": str(root / "log"), "auth_tries": 1,
            "auth_timeout": 3, "acceptance_wait_time": 1, "acceptance_wait_time_max": 1}))
        done = self.network.run([str(salt_bin / "salt-call"), "-c", str(root / "etc"), fun],
                                capture_output=True, text=True, timeout=60, check=False,
                                env={"PATH": "/usr/bin:/bin"})
        return done.stdout + done.stderr

    def close(self) -> None:
        for minion in (A_HV, A_VM, B_VM):
            self.forget(minion)


@pytest.fixture(scope="module")
def fleet(lab: LabInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(lab, tmp_path_factory.mktemp("red-team"))
    try:
        fleet.sign_in(A_HV, A_VM, B_VM)
        yield fleet
    finally:
        fleet.close()


@contextlib.contextmanager
def later(action: Any, *args: Any, seconds: float = 2) -> Iterator[None]:
    """`action(*args)` from another thread `seconds` into the block (a wait is under way)."""
    timer = threading.Timer(seconds, action, args=args)
    timer.start()
    try:
        yield
    finally:
        timer.join()


def store_a() -> Store:
    return Store.model_validate({"store_id": A, "erp": {"site_code": "RT-A"}, "hypervisor": {
        "hostname": f"hv-{A}.red-team.invalid", "mac": "52:54:00:9e:00:01"}})


def test_an_event_cannot_add_a_reaction_to_the_masters_reactor(fleet: Fleet) -> None:
    """The firstboot progress reactor rendered event values into YAML: a tag with a newline
    added B's own reaction (here: delete store A's server key; as well `local.cmd.run` on
    `*`, root on every minion)."""
    injected = (f"{FIRSTBOOT_EVENT_PREFIX}started\nred-team-delete-a:\n  wheel.key.delete:\n"
                f"    - args:\n      - match: {A_VM}")
    with fleet.master.subscribe(ROLLOUT_PROGRESS_TAG) as bus:
        fleet.as_b((injected, {"id": B_VM}), (f"{FIRSTBOOT_EVENT_PREFIX}started", {"id": B_VM}))
        # the honest event after it is re-announced: the reactor has seen both
        fleet.master.wait_for_event(bus, lambda e: e.tag == ROLLOUT_PROGRESS_TAG, timeout=30,
                                    what=ROLLOUT_PROGRESS_TAG)
    time.sleep(2)  # a reaction runs in the reactor's thread pool
    assert fleet.keys()[A_VM] == "accepted"


def test_a_forged_salt_auth_does_not_steer_the_autosign_guard(fleet: Fleet) -> None:
    """B claims that A's server just signed in with another store's outstanding token (read
    from that store's step-5 publication): the guard used to delete A's key."""
    token = fleet.master.issue_token(f"store-{B}x-vm")  # a store in the middle of its step 5
    try:
        with fleet.master.subscribe(AUTOSIGN_FORGED_TAG) as bus:
            fleet.as_b(("salt/auth", {"act": "accept", "result": True, "id": A_VM,
                                      "pub": "-----BEGIN PUBLIC KEY-----\nforged\n",
                                      "autosign_grains": {AUTOSIGN_GRAIN: token}}))
            try:
                forged: SaltEvent | None = fleet.master.wait_for_event(
                    bus, lambda e: e.tag == AUTOSIGN_FORGED_TAG, timeout=30,
                    what=AUTOSIGN_FORGED_TAG)
            except SaltEventTimeout:
                forged = None
        assert fleet.keys()[A_VM] == "accepted"
        assert forged and forged.data["id"] == A_VM  # the master names the attempt
        assert fleet.master.token_for(f"store-{B}x-vm") == token  # not spent either
    finally:
        fleet.master.revoke_token(f"store-{B}x-vm")


def test_a_forged_ready_event_does_not_pass_step_3(fleet: Fleet) -> None:
    """A's host is up but not ready (its highstate still runs); B fires its ready event."""
    step = Step()
    watcher = HypervisorReadyWatcher(fleet.master, A, A_HV, timeout=15, stall_timeout=600,
                                     logger=step.logger)
    with later(fleet.as_b, (HYPERVISOR_READY_TAG, {"id": A_HV, "data": {"store_id": A}})), \
            pytest.raises(SaltEventTimeout):
        watcher.wait()
    assert step.names(HYPERVISOR_READY_TAG, A_HV, "forged"), step.lines
    assert fleet.keys()[A_HV] == "accepted"


def test_a_forged_firstboot_done_does_not_pass_step_6(fleet: Fleet) -> None:
    """A's server is in its highstate; B fires its firstboot "done"."""
    step = Step()
    fleet.master.cmd(A_VM, "grains.setval", [FIRSTBOOT_STAGE_GRAIN, "highstate"])
    watcher = FirstbootWatcher(fleet.master, store_a(), timeout=15, stall_timeout=600,
                               contact_timeout=600, master_endpoint=("x", "4506"),
                               logger=step.logger)
    done = f"{FIRSTBOOT_EVENT_PREFIX}{FIRSTBOOT_EVENT_DONE}"
    with later(fleet.as_b, (done, {"id": A_VM, "data": {}})), pytest.raises(SaltEventTimeout):
        watcher.wait()
    assert step.names(done, A_VM, "forged"), step.lines


def test_a_forged_go_live_return_does_not_pass_step_7(
        fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    """A's server is down (its key accepted); B answers the gate's job in A's name with a
    passing table, on the bus, as soon as it sees the publication (every minion does)."""
    fleet.minions.stop(A_VM, "red team: A's server is down")
    listening = threading.Event()

    def answer_for_a() -> None:
        with fleet.master.subscribe("salt/job/") as bus:
            listening.set()
            new = fleet.master.wait_for_event(
                bus, lambda e: e.tag.endswith("/new") and e.data.get("fun") == GO_LIVE_FUNCTION,
                timeout=20, what="the gate's publication")
        jid = new.tag.split("/")[2]
        fleet.as_b((f"salt/job/{jid}/ret/{A_VM}", {
            "id": A_VM, "jid": jid, "fun": GO_LIVE_FUNCTION, "return": PASSING_GATE,
            "retcode": 0, "success": True}))

    forger = threading.Thread(target=answer_for_a)
    forger.start()
    listening.wait(10)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(SaltMinionNoResponse):
            fleet.master.cmd(A_VM, GO_LIVE_FUNCTION, [STORE_SERVER_CONFIG, time.time()],
                             timeout=12)
    finally:
        forger.join()
        fleet.minions.start(A_VM, "red team: A's server back")
        wait_for(lambda: fleet.master.ping(A_VM), timeout=60, what=f"{A_VM} back")
    assert f"a return claiming to be {A_VM}'s" in caplog.text and "forged" in caplog.text


def test_a_spoofed_auth_protocol_refusal_does_not_fail_step_3(fleet: Fleet) -> None:
    """No key needed: a machine on the store network signs in as A's host with the auth
    protocol of Salt 3006.0; the master refuses it and logs that. A's real host gets ready."""
    step = Step()
    watcher = HypervisorReadyWatcher(fleet.master, A, A_HV, timeout=60, stall_timeout=600,
                                     logger=step.logger)
    said = fleet.stranger(A_HV, HOST_PY36_SALT_BIN)
    wait_for(lambda: any(f"'{A_HV}' using protocol version 2" in line for line in
                         Path(fleet.master.opts["log_file"]).read_text().splitlines()[-200:]),
             timeout=30, what=f"the master's refusal logged (the stranger: {said[-800:]})")
    fleet.master.cmd(A_HV, "grains.setval", [HYPERVISOR_READY_GRAIN, True])
    try:
        assert watcher.wait()["minion"] == A_HV, said
    finally:
        fleet.master.cmd(A_HV, "grains.delkey", [HYPERVISOR_READY_GRAIN])
    assert step.names("refused a sign-in as", A_HV, "auth protocol 2"), step.lines
    assert fleet.keys()[A_HV] == "accepted"


def test_a_second_key_for_the_vm_id_stops_step_6(fleet: Fleet) -> None:
    """An intruder claims A's server id with its own key (the race for a VM's id): the master
    denies the later key, and step 6 no longer goes on with an id two keys claim."""
    fleet.master.cmd(A_VM, "grains.setval", [FIRSTBOOT_STAGE_GRAIN, "done"])
    try:
        fleet.stranger(A_VM, VENV_BIN)
        wait_for(lambda: A_VM in fleet.master.list_keys().get("minions_denied", []),
                 timeout=30, what=f"a denied key for {A_VM}")
        step = Step()
        watcher = FirstbootWatcher(fleet.master, store_a(), timeout=30, stall_timeout=600,
                                   contact_timeout=600, master_endpoint=("x", "4506"),
                                   logger=step.logger)
        with pytest.raises(MinionKeyContested,
                           match=f"two keys claim VM minion {A_VM}: accepted"):
            watcher.wait()
        # both keys are gone: nothing more is said to either machine until a person decides
        assert fleet.master.key_state(A_VM) is None
    finally:  # the other tests use A's server (a full run once ran this test before them)
        fleet.renew(A_VM)
