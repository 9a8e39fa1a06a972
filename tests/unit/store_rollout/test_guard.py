"""Issue 43: store_rollout/guard.py, the one gate of every destructive action.

First the guard's own rules (asked by name, approved under the policy, a window with room for
the whole sequence, the record of who asked and approved); then the swap check: with
`guard.authorize` swapped for one that refuses, every destructive path (step 2's reinstall and
power-on, step 5's recreation, a replacement's retirement of the old box, rollback,
decommission) refuses before its first change, so none can act around it; and every path
names `guard.authorize` (directly or through tasks/windows.py).
"""

from __future__ import annotations

import ast
import logging
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from store_rollout import guard
from store_rollout.disruption import DEFAULT_DISRUPTION_SECONDS
from store_rollout.guard import Action, ActionRefused, Consent
from store_rollout.inventory import parse_inventory
from store_rollout.inventory.calendar_spec import CalendarSpec
from tests.helpers import REPO_ROOT, settings_with
from tests.unit.store_rollout.test_step_rules import HV_KEYS, IMAGE, STORE, FakeBmc, FakeMaster, domain

ALWAYS = CalendarSpec(time_zone="UTC", windows=["daily 00:00-24:00"])
# the settings of that default calendar
ALWAYS_SETTINGS = {"default_time_zone": "UTC", "default_maintenance_windows": ["daily 00:00-24:00"]}
NIGHTS = CalendarSpec(time_zone="UTC", windows=["daily 22:00-06:00"])
SECONDS = dict(DEFAULT_DISRUPTION_SECONDS)  # step 2: 45 min, step 5: 20 min
MIDNIGHT = datetime(2026, 11, 27, 0, 0, tzinfo=UTC)


def authorize(action: Action, consent: Consent, calendar: CalendarSpec | None = ALWAYS,
              now: datetime = MIDNIGHT) -> guard.Authorization:
    return guard.authorize(action, STORE, consent, disruption_seconds=SECONDS,
                           default_calendar=calendar, now=now)


def test_an_action_nobody_asked_for_is_refused() -> None:
    with pytest.raises(ActionRefused, match="nobody asked for it by name"):
        authorize(Action.REINSTALL_HOST, Consent(asked=("recreate_vm",), policy="never"))


def test_an_action_the_policy_wants_approved_needs_the_approval() -> None:
    with pytest.raises(ActionRefused, match="needs an approval nobody gave"):
        authorize(Action.RECREATE_VM, Consent(asked=("recreate_vm",), policy="destructive"))
    done = authorize(Action.RECREATE_VM, Consent(
        asked=("recreate_vm",), asked_by="run rollout-0042", policy="destructive",
        approved=True, approved_by="ana", approved_at=MIDNIGHT))
    assert done.go and done.record["asked_by"] == "run rollout-0042"
    assert done.record["approval"] == "approved by ana"
    assert done.record["approved_at"] == MIDNIGHT.isoformat()


def test_the_window_must_hold_the_whole_sequence() -> None:
    """A reinstall at 05:10 in a window that ends at 06:00 would leave the store without its
    server (steps 2 to 5: 65 min) until the next night: it waits for the next window."""
    asked = Consent(asked=("reinstall_hypervisor",), policy="never")
    late = authorize(Action.REINSTALL_HOST, asked, NIGHTS, MIDNIGHT.replace(hour=5, minute=10))
    assert not late.go and late.wait_until == MIDNIGHT.replace(hour=22)
    assert "takes up to 1 h 05 min" in late.reason
    # step 2 alone (45 min) would have fit: the sequence is what is checked
    assert guard.sequence_seconds(Action.REINSTALL_HOST, SECONDS) == 3900
    assert authorize(Action.REINSTALL_HOST, asked, NIGHTS, MIDNIGHT.replace(hour=4)).go
    overridden = authorize(Action.REINSTALL_HOST, asked.model_copy(update={
        "ignore_windows": True, "approver": "ana"}), NIGHTS, MIDNIGHT.replace(hour=5, minute=10))
    assert overridden.go and overridden.record["window_overridden"]


def test_only_a_proven_approver_may_override_a_window() -> None:
    """Issue 44: ignore_windows is a run parameter anyone with the API could pass; with the
    policy `never` nobody would have been asked. Without a proven approver it is refused."""
    unproven = Consent(asked=("reinstall_hypervisor",), policy="never", ignore_windows=True)
    with pytest.raises(ActionRefused, match="only a proven approver may do that"):
        authorize(Action.REINSTALL_HOST, unproven, NIGHTS, MIDNIGHT.replace(hour=5, minute=10))
    # nothing to disrupt (a host found off): no approver needed to override anything
    assert authorize(Action.POWER_ON_HOST, Consent(ignore_windows=True), None).go


def test_no_calendar_anywhere_refuses_the_window() -> None:
    decision = authorize(Action.ROLLBACK, Consent(asked=("rollback",), policy="never"), None)
    assert not decision.go and decision.wait_until is None
    assert "no default one" in decision.reason


def test_powering_on_a_host_that_is_off_needs_no_request_approval_or_window() -> None:
    decision = authorize(Action.POWER_ON_HOST, Consent(), None)
    assert decision.go and "not needed" in decision.record["approval"]


# ----------------------------------------------- swap: every destructive path asks the guard

class Refused(Exception):
    """The swapped guard's answer."""


@pytest.fixture
def refusing_guard(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    asked: list[str] = []

    def refuse(action: Action, store: Any, consent: Consent, **_: Any) -> Any:
        asked.append(action.value)
        raise Refused(action.value)

    monkeypatch.setattr(guard, "authorize", refuse)
    return asked


class Cobbler:
    def __init__(self, record: dict[str, Any] | None) -> None:
        self.record = record

    def get_system(self, _name: str) -> dict[str, Any] | None:
        return self.record

    def profile_exists(self, _profile: str) -> bool:
        raise AssertionError("went on to install")


class Bmc(FakeBmc):
    def __init__(self, on: bool) -> None:
        super().__init__(on)
        self.actions: list[str] = []

    def power_on(self) -> None:
        self.actions.append("on")

    def power_off(self) -> None:
        self.actions.append("off")


@pytest.fixture
def systems(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """Fake Salt master, Cobbler and BMC behind every task module a destructive path uses."""
    from tasks import pxe_install, retire_box, virt

    world = SimpleNamespace(master=FakeMaster(HV_KEYS, domain(), ready=False),
                            cobbler=Cobbler({"netboot_enabled": False, "interfaces": {}}),
                            bmc=Bmc(on=False))
    settings = SimpleNamespace(salt_master_config="/dev/null", vm_type="kvm",
                               vm_images_dir="/srv/salt-images",
                               disruption_seconds=SECONDS, default_calendar=ALWAYS)
    # every task's part of the settings (store_rollout/settings_parts.py), read by attribute
    world.parts = {part: settings for part in ("salt", "cobbler", "power", "hosts", "images", "calendar")}
    for module in (pxe_install, virt, retire_box):
        monkeypatch.setattr(module, "get_run_logger", lambda: logging.getLogger("test"))
        monkeypatch.setattr(module, "master_client", lambda _config: world.master)
    for module in (pxe_install, retire_box):
        monkeypatch.setattr(module, "cobbler_client", lambda _settings: world.cobbler)
        monkeypatch.setattr(module, "bmc_client", lambda _store, _settings: world.bmc)
    monkeypatch.setattr(retire_box, "forget_store_minions",
                        lambda *_: (_ for _ in ()).throw(AssertionError("keys deleted")))
    return world


EVERYTHING = Consent(asked=tuple(a.value for a in Action), policy="never")


def test_every_task_path_refuses_when_the_guard_does(
        systems: SimpleNamespace, refusing_guard: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks import pxe_install, retire_box, virt

    monkeypatch.setattr(pxe_install, "run_started_at", lambda: datetime.now(UTC))
    install_parts = {k: v for k, v in systems.parts.items() if k != "images"}
    # step 2, an installed host found off (silent): powered on only through the guard
    with pytest.raises(Refused):
        pxe_install.pxe_install_hypervisor.fn(STORE, 1800.0, Consent(policy="never"),
                                              **install_parts)
    # step 2, an installed host asked to be reinstalled
    with pytest.raises(Refused):
        pxe_install.pxe_install_hypervisor.fn(STORE, 1800.0, EVERYTHING, **install_parts)
    # step 5, the existing domain asked to be recreated
    with pytest.raises(Refused):
        virt.create_vm.fn(STORE, IMAGE, 120, EVERYTHING, salt=systems.parts["salt"],
                          hosts=systems.parts["hosts"], images=systems.parts["images"],
                          calendar=systems.parts["calendar"])
    # a replacement's retirement of the old box
    new = STORE.model_copy(update={"hypervisor": STORE.hypervisor.model_copy(
        update={"mac": "52:54:00:42:00:99"})})
    with pytest.raises(Refused):
        retire_box.retire_old_box.fn(STORE, new, EVERYTHING, salt=systems.parts["salt"],
                                     cobbler=systems.parts["cobbler"],
                                     power=systems.parts["power"],
                                     calendar=systems.parts["calendar"])
    assert refusing_guard == ["power_on_host", "reinstall_hypervisor", "recreate_vm",
                              "replace_box"]
    # nothing was changed on the way: no power action, no VM call beyond reading it
    assert systems.bmc.actions == []
    assert not {"virt.init", "storevirt.remove_vm", "storevirt.stop"} & set(systems.master.calls)


@pytest.mark.parametrize("flow_module", ["flows.store_rollback", "flows.decommission"])
def test_rollback_and_decommission_refuse_when_the_guard_does(
        flow_module: str, refusing_guard: list[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    import importlib

    module = importlib.import_module(flow_module)
    flow = getattr(module, "store_rollback" if flow_module.endswith("rollback")
                   else "store_decommission")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text('stores: [{store_id: "0042", hypervisor: {hostname: hv.invalid, '
                         'mac: "52:54:00:42:00:01"}, erp: {site_code: DE-0042}}]')
    settings = settings_with(approval_policy="never", approval_timeout_seconds=60,
                             disruption_seconds=SECONDS, **ALWAYS_SETTINGS)
    changed: list[str] = []
    monkeypatch.setattr(module, "check_region", lambda *_: None)
    monkeypatch.setattr(module, "load_settings", lambda: settings)
    from tasks import undo

    monkeypatch.setattr(undo, "get_run_logger", lambda: logging.getLogger("test"))
    for name in ("remove_vm", "remove_vm_key", "disable_hypervisor_netboot",
                 "export_data_disk", "power_off_hypervisor", "remove_store_keys",
                 "remove_hypervisor_record", "notify_erp_decommissioned", "store_owner"):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, lambda *a, _n=name, **k: changed.append(_n))
    with pytest.raises(Refused):
        flow.fn.__wrapped__("0042", str(inventory))  # no heartbeats
    assert refusing_guard == ["rollback" if flow_module.endswith("rollback") else "decommission"]
    assert changed == []


# the functions that destroy or power a store's things, and where the guard is asked for them
GUARDED = {
    "tasks/pxe_install.py": ["pxe_install_hypervisor", "wake_silent_host"],
    "tasks/virt.py": ["create_vm"],
    "tasks/retire_box.py": ["retire_old_box"],
    "flows/store_rollback.py": ["store_rollback"],
    "flows/decommission.py": ["store_decommission"],
    "tasks/undo.py": ["undo_decision"],
}
GUARD_CALLS = {"authorize", "guarded_window", "install_window", "creation_window",
               "undo_decision"}


def test_every_destructive_path_names_the_guard() -> None:
    for rel, functions in GUARDED.items():
        tree = ast.parse((REPO_ROOT / rel).read_text())
        for name in functions:
            body = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                        and n.name == name)
            called = {getattr(c.func, "attr", getattr(c.func, "id", "")) for c in ast.walk(body)
                      if isinstance(c, ast.Call)}
            assert called & GUARD_CALLS, f"{rel}: {name} does not ask the guard"
    # and the guard is reached as guard.authorize, never imported by name (a swap would miss it)
    for path in [*REPO_ROOT.glob("tasks/**/*.py"), *REPO_ROOT.glob("flows/*.py")]:
        text = path.read_text()
        assert "import authorize" not in text and "authorize," not in text.split("import")[-1]


def test_a_csv_export_with_blank_calendar_cells_and_a_shared_bmc(tmp_path: Path) -> None:
    """Blank calendar cells: the chain's default calendar applies (no calendar of its own);
    two stores on one BMC address and port are refused naming both stores and the field."""
    from store_rollout.inventory import InventoryError, load_inventory

    csv = tmp_path / "erp.csv"
    header = ("store_id,hv_hostname,hv_mac,hv_power_type,hv_power_address,erp_site_code,"
              "time_zone,maintenance_windows\n")
    csv.write_text(header + "0001,hv1.invalid,52:54:00:00:00:01,ipmi,10.0.0.1,S1,,\n"
                   "0002,hv2.invalid,52:54:00:00:00:02,ipmi,10.0.0.1,S2,,\n")
    with pytest.raises(InventoryError, match="duplicate hypervisor.power_address .BMC address "
                                             "and port. '10.0.0.1:623' in stores '0001' and '0002'"):
        load_inventory(csv)
    csv.write_text(header + "0001,hv1.invalid,52:54:00:00:00:01,ipmi,10.0.0.1,S1,,\n"
                   "0002,hv2.invalid,52:54:00:00:00:02,ipmi,10.0.0.2,S2,,\n")
    stores = load_inventory(csv).stores
    assert [s.calendar for s in stores] == [None, None]
    assert guard.calendar_for(stores[0], ALWAYS) is ALWAYS
    # the same address on another port, or another Redfish system of one BMC, is another BMC
    parse_inventory({"stores": [
        {"store_id": n, "hypervisor": {"hostname": f"h{n}.invalid", "mac": f"52:54:00:00:00:0{n}",
                                       "power_type": "redfish", "power_address": "https://bmc",
                                       "redfish_system_id": f"sys{n}"},
         "erp": {"site_code": f"S{n}"}} for n in ("1", "2")]})


def test_a_replacement_on_another_stores_bmc_is_refused() -> None:
    from store_rollout.inventory import InventoryError
    from store_rollout.inventory.replacement import with_new_box

    inventory = parse_inventory({"stores": [
        {"store_id": n, "hypervisor": {"hostname": f"h{n}.invalid", "mac": f"52:54:00:00:00:0{n}",
                                       "power_type": "ipmi", "power_address": f"10.0.0.{n}"},
         "erp": {"site_code": f"S{n}"}} for n in ("1", "2")]})
    with pytest.raises(InventoryError, match="replace_box.power_address 10.0.0.2: the BMC of "
                                             "store 2's host"):
        with_new_box(inventory, "1", {"mac": "52:54:00:00:00:09", "power_address": "10.0.0.2"})


def test_the_default_calendar_setting() -> None:
    from store_rollout.settings import SettingsError, load_settings

    base = {"STORE_ROLLOUT_SALT_MASTER_CONFIG": "/dev/null",
            "STORE_ROLLOUT_SALT_MASTER_ADDRESS": "127.0.0.1",
            "STORE_ROLLOUT_COBBLER_URL": "https://c.invalid/", "STORE_ROLLOUT_COBBLER_USER": "u",
            "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK": "p", "STORE_ROLLOUT_ERP_URL": "https://e.invalid",
            "STORE_ROLLOUT_ERP_TOKEN_BLOCK": "t", "STORE_ROLLOUT_IMAGE_BASE_URL": "https://i.invalid"}
    assert load_settings(base).default_calendar is None
    given = load_settings({**base, "STORE_ROLLOUT_DEFAULT_TIME_ZONE": "Europe/Berlin",
                           "STORE_ROLLOUT_DEFAULT_MAINTENANCE_WINDOWS":
                               "Mon-Sat 22:00-06:00; Sun 00:00-24:00"}).default_calendar
    assert given is not None and given.windows == ["Mon-Sat 22:00-06:00", "Sun 00:00-24:00"]
    with pytest.raises(SettingsError, match="default_blackout_dates: .*needs both"):
        load_settings({**base, "STORE_ROLLOUT_DEFAULT_TIME_ZONE": "Europe/Berlin"})
    with pytest.raises(SettingsError, match="non-canonical time zone 'localtime'"):
        load_settings({**base, "STORE_ROLLOUT_DEFAULT_TIME_ZONE": "localtime",
                       "STORE_ROLLOUT_DEFAULT_MAINTENANCE_WINDOWS": "daily 01:00-02:00"})


def test_a_decommission_shuts_the_host_down_before_it_cuts_the_power() -> None:
    from tasks.bmc.task import shut_down_gracefully

    class Host(Bmc):
        def __init__(self, stops_after: int | None) -> None:
            super().__init__(on=True)
            self.stops_after, self.reads = stops_after, 0

        def shutdown(self) -> None:
            self.actions.append("shutdown")

        def power_state(self) -> str:
            self.reads += 1
            return "off" if self.stops_after is not None and self.reads >= self.stops_after \
                else "on"

    log = logging.getLogger("test")
    polite, slept = Host(stops_after=2), []
    assert shut_down_gracefully(polite, 10, slept.append, log) and slept == [2.0, 2.0]
    deaf, slept = Host(stops_after=None), []
    assert not shut_down_gracefully(deaf, 5, slept.append, log) and sum(slept) == 5
    assert deaf.actions == ["shutdown"]  # the power cut is the caller's, after this


def test_a_step_waiting_for_its_window_gives_its_fleet_slot_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks import windows

    events: list[str] = []

    class Slot:
        def take(self) -> None:
            events.append("take")

        def give_back(self) -> None:
            events.append("give back")

    answers = iter([{"window": {"go": False, "wait_until": MIDNIGHT, "reason": "closed"}},
                    {"window": {"go": True}, "done": True}])
    monkeypatch.setattr(windows, "wait_for_window", lambda *a: events.append("wait"))
    assert windows.run_in_window("0042", lambda: next(answers), Slot())["done"]
    assert events == ["give back", "wait", "take"]


def test_a_server_that_does_not_answer_is_one_line_naming_it() -> None:
    import httpx

    from app.runner import unreachable

    request = httpx.Request("GET", "http://127.0.0.1:9/api/flow_runs")
    try:
        try:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        except httpx.ConnectError as exc:
            raise RuntimeError("the client gave up") from exc
    except RuntimeError as wrapped:
        line = unreachable(wrapped)
    assert line is not None and line.startswith("the Prefect server at ")
    assert "Connection refused" in line and "\n" not in line
    assert unreachable(ValueError("no")) is None


def test_a_cancelled_rollout_only_cleans_up_a_store_that_never_went_live(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Cancel stops; it destroys nothing live. The rollout flow's (and so every batch child's)
    cancellation hook runs only the unfinished clean-up, which reads the ERP first: a live
    store, or one whose ERP does not answer, is left as it is."""
    from flows import rollout, store_rollback
    from tasks import undo
    from tasks.erp import ErpUnavailable

    assert [h.__name__ for h in rollout.store_rollout.on_cancellation_hooks] == ["stop_on_cancel"]
    called: list[dict[str, Any]] = []
    monkeypatch.setattr(rollout, "store_rollback", lambda *a, **k: called.append(k))
    monkeypatch.setattr(rollout, "end_hypervisor_wait", lambda store_id: None)
    run = SimpleNamespace(parameters={"store_id": "0042", "inventory": "inv.yaml"},
                          name="rollout-0042")
    rollout.stop_on_cancel(None, run, None)
    assert called == [{"own_store": False, "unfinished_only": True,
                       "asked_by": "the cancel of run rollout-0042"}]

    inventory = tmp_path / "inv.yaml"
    inventory.write_text('stores: [{store_id: "0042", hypervisor: {hostname: hv.invalid, '
                         'mac: "52:54:00:42:00:01"}, erp: {site_code: DE-0042}}]')
    removed: list[str] = []
    for name in ("remove_vm", "remove_vm_key", "disable_hypervisor_netboot"):
        monkeypatch.setattr(store_rollback, name,
                            lambda *a, _n=name, **k: removed.append(_n) or {})  # task results
    monkeypatch.setattr(store_rollback, "check_region", lambda *_: None)
    monkeypatch.setattr(undo, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(store_rollback, "load_settings", lambda: settings_with(
        disruption_seconds=SECONDS, audit_dir=str(tmp_path / "audit")))

    def erp(notices: Any) -> None:
        def read(_store_id: str) -> Any:
            if isinstance(notices, Exception):
                raise notices
            return notices
        monkeypatch.setattr(undo, "erp_client", lambda _settings: SimpleNamespace(notices=read))

    clean_up = store_rollback.store_rollback.fn.__wrapped__
    erp([{"status": "store-server-running"}])
    assert clean_up("0042", str(inventory), own_store=False,
                    unfinished_only=True)["left_as_is"] == "live store"
    erp(ErpUnavailable("the ERP does not answer"))
    assert "ERP unreadable" in clean_up("0042", str(inventory), own_store=False,
                                        unfinished_only=True)["left_as_is"]
    assert removed == []
    erp([])  # never live: its half-made VM goes, without a calendar or an approval
    done = clean_up("0042", str(inventory), own_store=False, unfinished_only=True)
    assert removed == ["remove_vm", "remove_vm_key", "disable_hypervisor_netboot"]
    assert done["authorization"]["action"] == "clean_unfinished"
    # each cancel is in the store's audit trail, with what it did
    from store_rollout import audit

    trail = audit.read(tmp_path / "audit", "0042")
    assert [(r["action"], r["decision"]) for r in trail] == [
        ("cancel", "left as is"), ("cancel", "left as is"), ("cancel", "done")], trail
    assert trail[0]["reason"] == "live store"
