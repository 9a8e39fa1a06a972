"""store_rollout/step_rules.py: each step's "already done" rule, once.

A test per predicate, then the planted checks that a rule cannot change in one place only:
- swapping a predicate for its negation flips both the plan's conclusion (store_rollout/fleet/)
  and what the step's task does (run on a fake master, a fake Cobbler), so neither side can
  carry its own copy of the rule without failing here;
- every rule's sites name `step_rules.<rule>`, and no module imports a predicate by name (a
  `from step_rules import x` would escape the swap), proven to fail on a planted inline rule.
"""

from __future__ import annotations

import ast
import logging
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from store_rollout import step_rules
from store_rollout.contracts import (
    FIRSTBOOT_STAGE_DONE,
    FIRSTBOOT_STAGE_NEW,
    POWER_CYCLED_META,
    STEP_CREATE_VM,
    STEP_FIRSTBOOT,
    STEP_NOTIFY_ERP,
    STEP_PREPARE_VM_KEYS,
    STEP_PXE_INSTALL_HYPERVISOR,
    STEP_WAIT_FOR_HYPERVISOR,
)
from store_rollout.disruption import DEFAULT_DISRUPTION_SECONDS
from store_rollout.fleet.facts import StoreFacts
from store_rollout.fleet.plan import StepPlan, plan_store
from store_rollout.guard import ActionRefused, Consent
from store_rollout.inventory import parse_inventory
from store_rollout.inventory.calendar_spec import CalendarSpec
from tasks import erp, pxe_install, salt_master, virt
from tasks.salt import HypervisorReadyWatcher, HypervisorWrongHardware, SaltEventTimeout
from tests.helpers import REPO_ROOT

KEY = "ab" * 32
UUID = "6f1c0d7e-0000-4000-8000-000000000042"
STORE = parse_inventory({"stores": [{
    "store_id": "0042", "hypervisor": {"hostname": "hv-0042.invalid", "mac": "52:54:00:42:00:01"},
    "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
    "erp": {"site_code": "DE-0042"}}]}).stores[0]
VM = STORE.vm_minion_id


def domain(**changes: Any) -> dict[str, Any]:
    """storevirt.domain_summary of the store's domain after a completed rollout."""
    return {"name": STORE.vm_name, "uuid": UUID, "active": True, "autostart": True,
            "disk": f"/srv/images/{STORE.vm_name}/system.qcow2",
            "backing": f"/srv/images/base/{KEY}/image.qcow2", "graphics": None,
            "seed": {"minion_id": VM, "state": "retired", "attached": False}, **changes}


# -------------------------------------------------------------------------- the predicates

@pytest.mark.parametrize(("key", "recorded", "ready", "installed"), [
    ("accepted", False, True, True),  # answers ready (a host of an older record)
    ("accepted", False, False, False),  # up, its install not finished, highstate not done
    ("accepted", True, False, True),  # install finished: silent now is still installed
    ("accepted", True, True, True),
    ("pending", True, True, False), ("denied", True, True, False), (None, True, False, False),
])
def test_hypervisor_installed(key: str | None, recorded: bool, ready: bool,
                              installed: bool) -> None:
    assert step_rules.hypervisor_installed(key, recorded, ready) is installed
    assert step_rules.hypervisor_installed(key, recorded, lambda: ready) is installed


@pytest.mark.parametrize(("exists", "netboot", "recorded"), [
    (True, False, True),  # the installer's end-of-install call turned netboot off
    (True, True, False),  # an install asked for and not finished
    (True, None, False), (False, None, False),
])
def test_install_recorded(exists: bool, netboot: bool | None, recorded: bool) -> None:
    assert step_rules.install_recorded(exists, netboot) is recorded


def test_store_live() -> None:
    assert not step_rules.store_live([])
    assert step_rules.store_live([{"status": "store-server-running"}])
    assert not step_rules.store_live([{"status": "store-server-running"},
                                      {"status": "store-decommissioned"}])


def test_reinstall_due_once_per_request() -> None:
    from datetime import UTC, datetime, timedelta

    asked = datetime(2026, 11, 26, 23, 0, tzinfo=UTC)
    assert step_rules.reinstall_due(True, None, asked)  # never installed by a run
    assert step_rules.reinstall_due(True, asked - timedelta(days=3), asked)  # the first install
    # the same run again (a retry, a resumed run) after it powered the host into the install
    assert not step_rules.reinstall_due(True, asked + timedelta(seconds=1), asked)
    assert not step_rules.reinstall_due(False, None, asked)  # not installed: an install anyway


def test_hypervisor_installed_asks_for_the_grain_only_of_an_accepted_key() -> None:
    asked: list[str] = []

    def ready() -> bool:
        asked.append("grain")
        return True

    assert not step_rules.hypervisor_installed("pending", False, ready)
    assert asked == []
    assert step_rules.hypervisor_installed("accepted", False, ready)
    assert asked == ["grain"]


NOW = datetime(2026, 11, 26, 15, 0, tzinfo=UTC)


@pytest.mark.parametrize(("ago", "on", "underway"), [
    (30, True, True),  # powered on into its install 30 s ago, still on
    (30, False, False),  # went off (or never came on): power it on again
    (1799, True, True), (1800, True, False),  # longer than an install takes: a failed one
    (-60, True, False),  # a clock that disagrees: no promise of an install
    (None, True, False),  # never power-cycled by step 2
])
def test_install_underway(ago: float | None, on: bool, underway: bool) -> None:
    cycled = None if ago is None else NOW - timedelta(seconds=ago)
    assert step_rules.install_underway(cycled, NOW, 1800, on) is underway
    asked: list[str] = []

    def powered_on() -> bool:
        asked.append("bmc")
        return on

    assert step_rules.install_underway(cycled, NOW, 1800, powered_on) is underway
    assert asked == ([] if cycled is None or not 0 <= (ago or 0) < 1800 else ["bmc"])


@pytest.mark.parametrize(("dom", "key", "kept"), [
    (domain(), "accepted", True),
    (domain(active=False), "accepted", True),  # merely down: its key stays
    (domain(), "pending", False), (domain(), None, False),
    (None, "accepted", False),  # the VM is created anew: its old key is stale
])
def test_vm_key_kept(dom: dict[str, Any] | None, key: str | None, kept: bool) -> None:
    assert step_rules.vm_key_kept(dom, key) is kept
    assert step_rules.vm_key_kept(dom, lambda: key) is kept


def test_vm_key_kept_reads_no_key_without_a_domain() -> None:
    def key_state() -> str:
        raise AssertionError("no domain: the key state does not matter")

    assert not step_rules.vm_key_kept(None, key_state)


def test_domain_reusable() -> None:
    assert step_rules.domain_reusable(domain())
    assert step_rules.domain_reusable(domain(active=False, backing="/srv/images/base/cd/i.qcow2"))
    assert not step_rules.domain_reusable(None)


@pytest.mark.parametrize(("dom", "needed"), [
    (domain(), False),
    (None, True),
    (domain(seed={}), True),  # defined, interrupted before its seed was written
    (domain(seed=None), True),
    (domain(seed={"minion_id": "store-0001-vm"}), True),  # another store's identity
])
def test_seed_needed(dom: dict[str, Any] | None, needed: bool) -> None:
    assert step_rules.seed_needed(dom, VM) is needed


@pytest.mark.parametrize(("dom", "needed"), [
    (domain(), False), (domain(active=False), True), (None, True),
])
def test_start_needed(dom: dict[str, Any] | None, needed: bool) -> None:
    assert step_rules.start_needed(dom) is needed


@pytest.mark.parametrize(("stage", "done"), [
    (FIRSTBOOT_STAGE_DONE, True), (FIRSTBOOT_STAGE_NEW, False), ("verify", False), (None, False),
])
def test_firstboot_done(stage: str | None, done: bool) -> None:
    assert step_rules.firstboot_done(stage) is done


@pytest.mark.parametrize(("expected", "reported", "matches"), [
    (None, None, True), (None, "ANY", True),  # no serial in the inventory: any box
    ("CZ123", "CZ123", True), ("cz123 ", "CZ123", True),  # labels and firmware differ in case
    ("CZ123", "CZ124", False), ("CZ123", None, False), ("CZ123", "", False),
])
def test_hardware_matches(expected: str | None, reported: str | None, matches: bool) -> None:
    assert step_rules.hardware_matches(expected, reported) is matches


def test_old_box_retired_once_the_record_holds_the_new_mac() -> None:
    assert step_rules.old_box_retired(["52:54:00:00:00:0A"], "52:54:00:00:00:0a")
    assert not step_rules.old_box_retired(["52:54:00:00:00:01"], "52:54:00:00:00:0a")
    assert not step_rules.old_box_retired([], "52:54:00:00:00:0a")  # no record yet


def test_a_box_notice_is_one_per_store_kind_and_box() -> None:
    key = step_rules.box_notice_key("0042", "store-decommissioned", "52:54:00:00:00:01")
    assert key == step_rules.box_notice_key("0042", "store-decommissioned", "52:54:00:00:00:01")
    assert key != step_rules.box_notice_key("0042", "store-hardware-replaced",
                                            "52:54:00:00:00:01")
    assert key != step_rules.box_notice_key("0042", "store-decommissioned", "52:54:00:00:00:02")


def test_erp_idempotency_key_is_one_per_store_and_vm() -> None:
    key = step_rules.erp_idempotency_key("0042", UUID)
    assert key.startswith("store-rollout-0042-") and len(key) == len("store-rollout-0042-") + 32
    assert key == step_rules.erp_idempotency_key("0042", UUID)
    assert key != step_rules.erp_idempotency_key("0042", UUID.replace("42", "43"))
    assert key != step_rules.erp_idempotency_key("0043", UUID)


def test_erp_notice_for() -> None:
    earlier = {"id": "ERP-1", "vm_uuid": "0000"}
    this = {"id": "ERP-2", "vm_uuid": UUID}
    assert step_rules.erp_notice_for([earlier, this], UUID) is this
    assert step_rules.erp_notice_for([earlier], UUID) is None
    assert step_rules.erp_notice_for([{"id": "ERP-3"}], None) is None  # no VM: nothing known


# ------------------------------------------------- planted check: swap a rule, both sides follow

def facts(**changes: Any) -> StoreFacts:
    """The store after a completed rollout, as plan and reconcile see it."""
    return StoreFacts(
        store_id=STORE.store_id, hypervisor=STORE.hypervisor_minion_id, vm=VM,
        domain_name=STORE.vm_name, cobbler_system=STORE.cobbler_system, image_key=KEY,
        image_cached=True, image_builder="lab", cobbler_record=True, cobbler_netboot=False,
        hypervisor_key="accepted", hypervisor_answering=True, hypervisor_ready=True,
        base_image_on_hypervisor=True, domain=domain(), domain_known=True, vm_key="accepted",
        vm_answering=True, firstboot_stage=FIRSTBOOT_STAGE_DONE,
        erp_notices=[{"id": "ERP-1", "vm_uuid": UUID}]).model_copy(update=changes)


def step(f: StoreFacts, name: str) -> StepPlan:
    return next(p for p in plan_store(f) if p.step == name)


class WouldInstall(Exception):
    """The fake Cobbler's answer to step 2 going on to install."""


class FakeMaster:
    """The Salt master as the tasks of steps 2, 4 and 5 use it, over one store whose state is
    `keys` and `domain`; `calls` lists the functions run on minions, in order."""

    def __init__(self, keys: dict[str, str], dom: dict[str, Any] | None, ready: bool = True):
        self.keys, self.domain, self.ready = dict(keys), dom, ready
        self.calls: list[str] = []
        self.tokens: list[str] = []

    def key_state(self, minion: str) -> str | None:
        return self.keys.get(minion)

    def list_keys(self) -> dict[str, list[str]]:
        buckets = {"accepted": "minions", "pending": "minions_pre", "denied": "minions_denied"}
        return {buckets[state]: [minion] for minion, state in self.keys.items()}

    def delete_key(self, minion: str) -> bool:
        return self.keys.pop(minion, None) is not None

    def issue_token(self, minion: str) -> str:
        self.tokens.append(minion)
        return "token"

    def token_for(self, minion: str) -> str | None:
        return "token" if minion in self.tokens else None

    def extension_hashes(self) -> tuple[str, dict[str, str]]:
        return "sha256", {"modules/storevirt.py": "same"}

    def cmd_multi(self, minion: str, calls: list[tuple[str, list[Any]]],
                  timeout: float = 60) -> dict[str, Any]:
        return {fun: self.cmd(minion, fun, args) for fun, args in calls}

    def cmd(self, minion: str, fun: str, arg: Any = (), kwarg: Any = None,
            timeout: float = 60, gather_job_timeout: float | None = None) -> Any:
        self.calls.append(fun)
        if fun == "storevirt.extension_hashes":
            return self.extension_hashes()[1]
        base = f"/srv/images/base/{KEY}/image.qcow2"
        if fun == "storevirt.domain_summary":
            return None if self.domain is None else dict(self.domain)
        if fun == "virt.init":
            self.domain = domain(uuid="new", active=False, autostart=False, seed={})
        elif fun == "storevirt.seed_identity" and self.domain is not None:
            self.domain["seed"] = {"minion_id": arg[1]["minion_id"], "attached": True}
        elif fun in ("virt.start", "storevirt.stop") and self.domain is not None:
            self.domain["active"] = fun == "virt.start"
        elif fun == "storevirt.set_autostart" and self.domain is not None:
            self.domain["autostart"] = True
        return {"grains.get": self.ready, "saltutil.sync_utils": [], "saltutil.sync_modules": [],
                "storevirt.ensure_base_image": {"path": base, "cached": True, "transferred": 0,
                                                "seconds": 0, "resumed_from": None},
                "storevirt.create_overlay": {"path": domain()["disk"]},
                "storevirt.create_data_disk": {"path": f"/srv/images/{STORE.vm_name}/data.raw",
                                               "created": True},
                "storevirt.seed_path": f"/srv/images/{STORE.vm_name}/seed.iso"}.get(fun, True)


@pytest.fixture
def run_task(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """Run a task's body on a FakeMaster (and a Cobbler that says WouldInstall)."""
    settings = SimpleNamespace(salt_master_config="/dev/null", vm_type="kvm",
                               hypervisor_platform="sle16-kvm", hypervisor_libvirt_uri="",
                               sle16_product="leap", registration_url="",
                               registration_code_block="",
                               image_base_url="https://images.invalid", image_ca_bundle="",
                               image_rate_limit="",
                               disruption_seconds=dict(DEFAULT_DISRUPTION_SECONDS),
                               default_calendar=CalendarSpec(time_zone="UTC",
                                                             windows=["daily 00:00-24:00"]))

    class Cobbler:
        record: dict[str, Any] | None = None

        def get_system(self, _name: str) -> dict[str, Any] | None:
            return self.record

        def profile_exists(self, _profile: str) -> bool:
            raise WouldInstall

    def run(task: Any, master: FakeMaster, *args: Any) -> Any:
        module = {"pxe_install_hypervisor": pxe_install, "prepare_vm_keys": salt_master,
                  "create_vm": virt}[task.name]
        monkeypatch.setattr(module, "get_run_logger", lambda: logging.getLogger("test"))
        monkeypatch.setattr(module, "master_client", lambda _config: master)
        if module is salt_master:  # its Cobbler record's install secrets: none to remove
            monkeypatch.setattr(module, "cobbler_client", lambda _settings: None)
            monkeypatch.setattr(module, "forget_install_secrets", lambda _store, _client: [])
        if module is pxe_install:
            cobbler = Cobbler()
            cobbler.record = getattr(master, "cobbler_record", None)
            monkeypatch.setattr(module, "cobbler_client", lambda _settings: cobbler)
            monkeypatch.setattr(module, "bmc_client", lambda _store, _settings: FakeBmc(
                getattr(master, "host_on", False)))
        # each task's parts of the settings (store_rollout/settings_parts.py), read by attribute
        parts = {"pxe_install_hypervisor": ("salt", "cobbler", "power", "hosts", "calendar"),
                 "prepare_vm_keys": ("salt", "cobbler"),
                 "create_vm": ("salt", "hosts", "images", "calendar")}[task.name]
        return task.fn(STORE, *args, **dict.fromkeys(parts, settings))

    return run


@pytest.fixture
def negate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    def swap(name: str) -> None:
        rule = getattr(step_rules, name)
        monkeypatch.setattr(step_rules, name, lambda *a, **k: not rule(*a, **k))
    yield swap


IMAGE = {"key": KEY, "sha256": "0" * 64, "meta": {}}
HV_KEYS = {STORE.hypervisor_minion_id: "accepted", VM: "accepted"}


class FakeBmc:
    label = "store 0042: IPMI BMC 10.0.0.9:623"

    def __init__(self, on: bool) -> None:
        self.on = on

    def power_state(self) -> str:
        return "on" if self.on else "off"


def pxe_outcome(run_task: Callable[..., Any], master: FakeMaster | None = None) -> str:
    try:
        result = run_task(pxe_install.pxe_install_hypervisor, master or FakeMaster(HV_KEYS, domain()))
    except WouldInstall:
        return "install"
    return "skipped" if result["skipped"] else "underway" if result["install_underway"] else "?"


def test_swapping_hypervisor_installed_flips_step_2_in_plan_and_task(
        run_task: Callable[..., Any], negate: Callable[[str], None]) -> None:
    assert not step(facts(), STEP_PXE_INSTALL_HYPERVISOR).todo
    assert pxe_outcome(run_task) == "skipped"
    negate("hypervisor_installed")
    assert step(facts(), STEP_PXE_INSTALL_HYPERVISOR).todo
    assert pxe_outcome(run_task) == "install"


def test_swapping_install_underway_flips_step_2_in_plan_and_task(
        run_task: Callable[..., Any], negate: Callable[[str], None]) -> None:
    master = FakeMaster({}, None)  # the host is installing: no key accepted yet
    master.host_on = True  # type: ignore[attr-defined]
    master.cobbler_record = {"autoinstall_meta": {  # type: ignore[attr-defined]
        POWER_CYCLED_META: (datetime.now(UTC) - timedelta(seconds=30)).isoformat()}}
    underway = facts(hypervisor_key=None, hypervisor_ready=False, host_powered_on=True,
                     power_cycled_at=datetime.now(UTC) - timedelta(seconds=30))
    assert pxe_outcome(run_task, master) == "underway"
    assert not step(underway, STEP_PXE_INSTALL_HYPERVISOR).todo
    negate("install_underway")
    assert pxe_outcome(run_task, master) == "install"
    assert step(underway, STEP_PXE_INSTALL_HYPERVISOR).todo


def test_swapping_reinstall_due_flips_a_requested_reinstall_in_plan_and_task(
        run_task: Callable[..., Any], negate: Callable[[str], None],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ready host, on, that the last install powered on 10 minutes before this run began
    (within step 3's timeout: no install is underway on a ready host all the same)."""
    began = datetime.now(UTC)
    monkeypatch.setattr(pxe_install, "run_started_at", lambda: began)
    master = FakeMaster(HV_KEYS, domain())
    master.host_on = True  # type: ignore[attr-defined]
    master.cobbler_record = {"autoinstall_meta": {  # type: ignore[attr-defined]
        POWER_CYCLED_META: (began - timedelta(minutes=10)).isoformat()}}

    def reinstall() -> str:
        try:
            result = run_task(pxe_install.pxe_install_hypervisor, master, 1800.0, Consent(
                asked=("reinstall_hypervisor",), policy="never"))
        except WouldInstall:
            return "install"
        return "skipped" if result["skipped"] else "underway" if result["install_underway"] else "?"

    def destructive() -> bool:
        plan = plan_store(facts(power_cycled_at=began - timedelta(minutes=10)),
                          reinstall_hypervisor=True)
        return next(p for p in plan if p.step == STEP_PXE_INSTALL_HYPERVISOR).destructive

    assert reinstall() == "install" and destructive()
    assert pxe_outcome(run_task, master) == "skipped"  # not asked: a ready host is left alone
    negate("reinstall_due")
    assert reinstall() == "skipped" and not destructive()


def test_swapping_vm_key_kept_flips_step_4_in_plan_and_task(
        run_task: Callable[..., Any], negate: Callable[[str], None]) -> None:
    assert not step(facts(), STEP_PREPARE_VM_KEYS).todo
    assert not run_task(salt_master.prepare_vm_keys, FakeMaster(HV_KEYS, domain()))["token_issued"]
    negate("vm_key_kept")
    assert step(facts(), STEP_PREPARE_VM_KEYS).todo
    assert run_task(salt_master.prepare_vm_keys, FakeMaster(HV_KEYS, domain()))["token_issued"]


def test_swapping_domain_reusable_flips_step_5_in_plan_and_task(
        run_task: Callable[..., Any], negate: Callable[[str], None]) -> None:
    master = FakeMaster(HV_KEYS, domain())
    assert step(facts(), STEP_CREATE_VM).action.startswith("reuse ")
    assert run_task(virt.create_vm, master, IMAGE)["reused"]
    assert "virt.init" not in master.calls
    negate("domain_reusable")
    master = FakeMaster(HV_KEYS, domain())
    assert step(facts(), STEP_CREATE_VM).action.startswith("create ")
    # the task goes to define the domain anew: over a domain that exists, only as the guard
    # lets it (nobody asked for recreate_vm here)
    with pytest.raises(ActionRefused, match="recreate_vm refused"):
        run_task(virt.create_vm, master, IMAGE)
    assert "virt.init" not in master.calls
    asked = Consent(asked=("recreate_vm",), policy="never")
    assert not run_task(virt.create_vm, FakeMaster(HV_KEYS, domain()), IMAGE, 120, asked)[
        "reused"]


def test_swapping_seed_needed_flips_step_5_in_plan_and_task(
        run_task: Callable[..., Any], negate: Callable[[str], None]) -> None:
    master = FakeMaster(HV_KEYS, domain())
    assert not step(facts(), STEP_CREATE_VM).todo
    run_task(virt.create_vm, master, IMAGE)
    assert "storevirt.seed_identity" not in master.calls
    negate("seed_needed")
    master = FakeMaster(HV_KEYS, domain())
    assert "seed its identity" in step(facts(), STEP_CREATE_VM).action
    run_task(virt.create_vm, master, IMAGE)
    assert "storevirt.seed_identity" in master.calls


def test_swapping_start_needed_flips_step_5_in_plan_and_task(
        run_task: Callable[..., Any], negate: Callable[[str], None]) -> None:
    stopped = facts(domain=domain(active=False))
    master = FakeMaster(HV_KEYS, domain(active=False))
    assert "start it" in step(stopped, STEP_CREATE_VM).action
    run_task(virt.create_vm, master, IMAGE)
    assert "virt.start" in master.calls
    negate("start_needed")
    master = FakeMaster(HV_KEYS, domain(active=False))
    assert not step(stopped, STEP_CREATE_VM).todo
    run_task(virt.create_vm, master, IMAGE)
    assert "virt.start" not in master.calls


def test_swapping_firstboot_done_flips_step_6_in_plan_and_watcher(
        negate: Callable[[str], None]) -> None:
    from tests.unit.tasks.test_salt_watchers import FakeClock, fb_watcher
    from tests.unit.tasks.test_salt_watchers import FakeMaster as WatchedMaster

    def wait() -> str:
        clock = FakeClock()
        try:
            fb_watcher(WatchedMaster(clock, [], grain=lambda t: FIRSTBOOT_STAGE_DONE), clock,
                       timeout=30).wait()
        except SaltEventTimeout:
            return "waited"
        return "done at once" if clock.now == 0 else "?"

    assert not step(facts(), STEP_FIRSTBOOT).todo
    assert wait() == "done at once"
    negate("firstboot_done")
    assert step(facts(), STEP_FIRSTBOOT).todo
    assert wait() == "waited"


def test_swapping_hardware_matches_flips_step_3_in_plan_and_watcher(
        negate: Callable[[str], None]) -> None:
    serials = {"expected_serial": "CZ123", "hypervisor_serial": "CZ123"}

    class Master(FakeMaster):
        def list_keys(self) -> dict[str, list[str]]:
            return {"minions": list(self.keys)}

        def revoke_token(self, minion: str) -> bool:
            return True

        def log_tail(self) -> Any:
            return SimpleNamespace(auth_refusals=lambda minion: [])

        def cmd(self, minion: str, fun: str, arg: Any = (), kwarg: Any = None,
                timeout: float = 60, gather_job_timeout: float | None = None) -> Any:
            return "CZ123" if fun == "grains.get" else super().cmd(minion, fun, arg, kwarg)

    def watched() -> str:
        watcher = HypervisorReadyWatcher(Master(HV_KEYS, domain()), "0042",
                                         STORE.hypervisor_minion_id, timeout=60,
                                         stall_timeout=60, logger=logging.getLogger("test"),
                                         serial="CZ123")
        try:
            return str(watcher.wait(already_ready=True)["serial"])
        except HypervisorWrongHardware:
            return "refused"

    assert not step(facts(**serials), STEP_WAIT_FOR_HYPERVISOR).todo
    assert watched() == "CZ123"
    negate("hardware_matches")
    assert step(facts(**serials), STEP_WAIT_FOR_HYPERVISOR).action.startswith("fails: ")
    assert watched() == "refused"


def test_swapping_the_erp_rules_flips_plan_and_the_notice(
        monkeypatch: pytest.MonkeyPatch, negate: Callable[[str], None]) -> None:
    notice = erp.ErpNotice(store_id="0042", site_code="DE-0042", cost_center=None,
                           hypervisor="hv", vm_domain="vm", vm_minion=VM, vm_uuid=UUID)
    assert notice.idempotency_key() == step_rules.erp_idempotency_key("0042", UUID)
    monkeypatch.setattr(step_rules, "erp_idempotency_key", lambda store_id, uuid: "swapped")
    assert notice.idempotency_key() == "swapped"
    assert not step(facts(), STEP_NOTIFY_ERP).todo
    monkeypatch.setattr(step_rules, "erp_notice_for", lambda notices, uuid: None)
    assert step(facts(), STEP_NOTIFY_ERP).todo


# ---------------------------------------- planted check: every site names the rule it applies

# rule -> the functions that decide with it: the step's task (or its client) and the plan
SITES: dict[str, list[tuple[str, str]]] = {
    "hypervisor_installed": [("tasks/pxe_install.py", "installed_already"),
                             ("store_rollout/fleet/facts.py", "installed")],
    "reinstall_due": [("tasks/pxe_install.py", "installed_already"),
                      ("store_rollout/fleet/plan.py", "plan_store")],
    "install_underway": [("tasks/pxe_install.py", "pxe_install_hypervisor"),
                         ("store_rollout/fleet/facts.py", "install_underway")],
    "vm_key_kept": [("tasks/salt_master.py", "prepare_vm_keys"),
                    ("store_rollout/fleet/plan.py", "_keys")],
    "domain_reusable": [("tasks/virt.py", "create_vm"),
                        ("store_rollout/fleet/plan.py", "_create_vm"),
                        ("store_rollout/fleet/plan.py", "_image")],
    "seed_needed": [("tasks/store_vm.py", "settle"), ("store_rollout/fleet/plan.py", "_reuse_vm")],
    "start_needed": [("tasks/virt.py", "create_vm"), ("store_rollout/fleet/plan.py", "_reuse_vm"),
                     ("store_rollout/fleet/facts.py", "running")],
    "firstboot_done": [("tasks/salt/firstboot_watcher.py", "wait"),
                       ("tasks/salt/firstboot_watcher.py", "_relevant"),
                       ("tasks/salt/firstboot_watcher.py", "_confirm_done"),
                       ("store_rollout/fleet/facts.py", "firstboot_done")],
    "hardware_matches": [("tasks/salt/watchers.py", "_check_hardware"),
                         ("store_rollout/fleet/facts.py", "wrong_hardware")],
    "erp_idempotency_key": [("tasks/erp.py", "idempotency_key")],
    "erp_notice_for": [("store_rollout/fleet/facts.py", "notice_for_vm")],
    "decommissioned": [("store_rollout/fleet/facts.py", "decommissioned")],
    "box_notice_key": [("tasks/erp.py", "idempotency_key")],
    "old_box_retired": [("tasks/retire_box.py", "retire_old_box")],
    "install_recorded": [("tasks/pxe_install.py", "installed_already"),
                         ("store_rollout/fleet/facts.py", "installed"),
                         ("tasks/observe.py", "_host_on")],
    "store_live": [("tasks/undo.py", "cancel_leaves_as_is"),
                   ("store_rollout/fleet/reconcile.py", "_after_ended")],
}
CHECKED = ("store_rollout", "tasks", "flows", "app")


def rule_problems(root: Path) -> list[str]:
    problems = []
    for package in CHECKED:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "store_rollout.step_rules":
                    problems.append(f"{path.relative_to(root)}:{node.lineno} imports predicates "
                                    "by name: use `from store_rollout import step_rules`")
    for rule, sites in SITES.items():
        for rel, function in sites:
            tree = ast.parse((root / rel).read_text())
            found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                     and n.name == function]
            named = any(isinstance(n, ast.Attribute) and n.attr == rule
                        and isinstance(n.value, ast.Name) and n.value.id == "step_rules"
                        for f in found for n in ast.walk(f))
            if not named:
                problems.append(f"{rel}: {function} does not apply step_rules.{rule}")
    return problems


def test_every_rule_is_applied_where_it_is_decided() -> None:
    assert set(SITES) == {n for n, v in vars(step_rules).items()
                          if callable(v) and getattr(v, "__module__", "") == step_rules.__name__
                          and not n.startswith("_")}
    assert rule_problems(REPO_ROOT) == []


def test_a_rule_written_again_inline_is_found(tmp_path: Path) -> None:
    for package in CHECKED:
        shutil.copytree(REPO_ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    keys = tmp_path / "tasks" / "salt_master.py"
    text = keys.read_text()
    inline = text.replace("step_rules.vm_key_kept(domain, lambda: master.key_state(minion))",
                          'domain is not None and master.key_state(minion) == "accepted"')
    assert inline != text
    keys.write_text(inline)
    (tmp_path / "flows" / "sneaky.py").write_text(
        "from store_rollout.step_rules import start_needed\n")
    assert rule_problems(tmp_path) == [
        "flows/sneaky.py:1 imports predicates by name: use `from store_rollout import step_rules`",
        "tasks/salt_master.py: prepare_vm_keys does not apply step_rules.vm_key_kept"]
