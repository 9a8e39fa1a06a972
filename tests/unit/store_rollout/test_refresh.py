"""Issue 48, a hardware refresh's identities and refusals: the inventory's hypervisor.minion_id
(checked against the store and its MAC), the store as it will be on its new box
(store_rollout/refresh.py refreshed_store), every refusal before anything moves
(refresh_problems, decide_refresh), the guard's REFRESH_HARDWARE, the ERP notice's identity,
the old box's retirement that never runs while the new box does not run the VM, and the CLI
refusing another store's box before anything starts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from store_rollout import guard
from store_rollout.contracts import ERP_STORE_HARDWARE_REFRESHED, REFRESHED_HV_ID_RE
from store_rollout.disruption import DEFAULT_DISRUPTION_SECONDS, STEP_HARDWARE_REFRESH
from store_rollout.guard import Action, ActionRefused, Consent
from store_rollout.inventory import InventoryError, load_inventory, parse_inventory
from store_rollout.inventory.calendar_spec import CalendarSpec
from store_rollout.refresh import (
    RefreshRefused,
    decide_refresh,
    inventory_update,
    refresh_problems,
    refreshed_store,
)


def store(n: str, **hv: Any) -> dict[str, Any]:
    return {"store_id": n, "hypervisor": {
        "hostname": f"hv-{n}.stores.invalid", "mac": f"52:54:00:00:00:{n[-2:]}",
        "power_type": "ipmi", "power_address": f"10.0.0.{int(n)}", "serial": f"SN{n}", **hv},
        "erp": {"site_code": f"S{n}"}}


STATIC = {"netmask": "255.255.255.0"}
INVENTORY = parse_inventory({"stores": [store("0001"), store("0002", ip="10.1.0.2", **STATIC),
                                        store("0003", ip="10.1.0.3", **STATIC)]})
NEW = {"mac": "52:54:00:a1:b2:c3", "power_address": "10.0.9.1", "serial": "NEW1"}


# -- the inventory's hypervisor.minion_id ------------------------------------------------------
def test_a_store_without_minion_id_keeps_its_hypervisor_id() -> None:
    first = INVENTORY.get("0001")
    assert first.hypervisor_minion_id == first.cobbler_system == "store-0001-hv"


def test_a_refreshed_boxs_minion_id_is_read_from_yaml_and_csv(tmp_path: Path) -> None:
    given = parse_inventory({"stores": [store("0001", mac="52:54:00:a1:b2:c3",
                                              minion_id="store-0001-hv-a1b2c3")]}).stores[0]
    assert given.hypervisor_minion_id == given.cobbler_system == "store-0001-hv-a1b2c3"
    csv = tmp_path / "erp.csv"
    csv.write_text("store_id,hv_hostname,hv_mac,hypervisor_minion_id,erp_site_code\n"
                   "0001,hv1.invalid,52:54:00:A1:B2:C3,store-0001-hv-a1b2c3,S1\n")
    assert load_inventory(csv).stores[0].hypervisor_minion_id == "store-0001-hv-a1b2c3"


@pytest.mark.parametrize("minion_id, says", [
    ("store-0001-hv-a1b2c4", "does not end in the last 6 hex digits of hypervisor.mac"),
    ("store-0002-hv-a1b2c3", "is not store 0001's"),
    ("store-0001-vm", "is not store 0001's"),
    ("hv-a1b2c3", "is not store 0001's"),
])
def test_a_minion_id_not_the_stores_is_refused_naming_the_field(minion_id: str, says: str) -> None:
    with pytest.raises(InventoryError, match=f"store '0001': hypervisor: minion_id "
                                             f"'{minion_id}' {says}") as err:
        parse_inventory({"stores": [store("0001", mac="52:54:00:a1:b2:c3", minion_id=minion_id)]})
    assert "write store-0001-hv or store-0001-hv-a1b2c3" in str(err.value)


# -- the store on its new box ------------------------------------------------------------------
def test_the_refreshed_store_is_the_new_box_under_an_id_of_its_own() -> None:
    old = INVENTORY.get("0001")
    new = refreshed_store(old, NEW)
    hv = new.hypervisor
    assert new.hypervisor_minion_id == new.cobbler_system == "store-0001-hv-a1b2c3"
    assert REFRESHED_HV_ID_RE and hv.minion_id == "store-0001-hv-a1b2c3"
    assert (hv.mac, hv.power_address, hv.serial) == ("52:54:00:a1:b2:c3", "10.0.9.1", "NEW1")
    assert hv.hostname == "hv-0001-a1b2c3.stores.invalid"  # Cobbler keeps one name per box
    assert (new.vm_minion_id, new.vm_name) == (old.vm_minion_id, old.vm_name)
    assert refreshed_store(old, {"mac": "52:54:00:a1:b2:c3"}).hypervisor.serial is None
    # a second refresh replaces the first one's suffix
    again = parse_inventory({"stores": [store("0001", mac="52:54:00:a1:b2:c3",
                                              minion_id="store-0001-hv-a1b2c3",
                                              hostname="hv-0001-a1b2c3.stores.invalid")]})
    twice = refreshed_store(again.get("0001"), {"mac": "52:54:00:d4:e5:f6"})
    assert twice.hypervisor.hostname == "hv-0001-d4e5f6.stores.invalid"
    assert inventory_update(new)["hypervisor.minion_id"] == "store-0001-hv-a1b2c3"


def test_a_refreshed_store_with_a_bad_field_is_refused_naming_it() -> None:
    with pytest.raises(InventoryError, match="refresh of store 0001: hypervisor.mac: invalid MAC"):
        refreshed_store(INVENTORY.get("0001"), {"mac": "nope"})
    with pytest.raises(InventoryError, match="refresh box: unknown hostname"):
        refreshed_store(INVENTORY.get("0001"), {"mac": NEW["mac"], "hostname": "x.invalid"})


@pytest.mark.parametrize("box, says", [
    ({"mac": "52:54:00:00:00:01", "power_address": "10.0.9.1"},
     "refresh --mac 52:54:00:00:00:01: the MAC of store 0001's current box"),
    ({"mac": "52:54:00:00:00:02", "power_address": "10.0.9.1"},
     "refresh --mac 52:54:00:00:00:02: store 0002's box in the inventory"),
    ({**NEW, "serial": "SN0002"}, "refresh --serial SN0002: store 0002's box in the inventory"),
    ({**NEW, "serial": "SN0001"}, "refresh --serial SN0001: the serial of store 0001's current"),
    ({**NEW, "power_address": "10.0.0.2"},
     "refresh --bmc-address 10.0.0.2: store 0002's box in the inventory"),
    ({"mac": NEW["mac"]}, "refresh --bmc-address 10.0.0.1: the BMC of store 0001's current box"),
    ({**NEW, "ip": "10.1.0.2", "netmask": "255.255.255.0"}, "refresh box: unknown netmask"),
    ({**NEW, "ip": "10.1.0.2"}, "ip 10.1.0.2 without a netmask: add netmask"),
    ({**NEW, "ip": "bad"}, "hypervisor.ip: invalid IPv4 address"),
    ({"serial": "X"}, "refresh box: mac missing"),
])
def test_each_refusal_names_the_field_and_the_fix(box: dict[str, Any], says: str) -> None:
    problems = refresh_problems(INVENTORY, "0001", box)
    assert any(says in p for p in problems), problems


def test_a_static_address_needs_the_new_boxs_own() -> None:
    problems = refresh_problems(INVENTORY, "0002", {**NEW})
    assert problems == ["refresh --ip: store 0002's hypervisor has the static address 10.1.0.2, "
                        "which its current box keeps until it is retired: give the new box's "
                        "own static address (--ip)"]
    assert refresh_problems(INVENTORY, "0002", {**NEW, "ip": "10.1.0.4"}) == []
    assert refresh_problems(INVENTORY, "0002", {**NEW, "ip": "10.1.0.3"}) == [
        "refresh --ip 10.1.0.3: store 0003's box in the inventory, not a new box of store 0002: "
        "give the new box's own"]
    assert any("the current box's address" in p
               for p in refresh_problems(INVENTORY, "0002", {**NEW, "ip": "10.1.0.2"}))


def test_a_new_box_of_its_own_is_no_problem_and_an_unknown_store_is_one() -> None:
    assert refresh_problems(INVENTORY, "0001", NEW) == []
    assert "store_id '0009' is not in the inventory" in refresh_problems(INVENTORY, "0009", NEW)[0]


# -- what a run does from what the systems say -------------------------------------------------
LIVE = {"old_key": "accepted", "new_key": None, "old_record": True, "live": True,
        "domain": {"name": "store-0001-vm", "data_disk": "/d/data.raw", "on": "old"}}


def test_decide_refresh() -> None:
    old = INVENTORY.get("0001")
    new = refreshed_store(old, NEW)
    assert decide_refresh(old, new, LIVE).action == "refresh"
    moved = {**LIVE, "new_key": "accepted", "domain": {**LIVE["domain"], "on": "new"}}
    assert "runs on the new box" in decide_refresh(old, new, moved).reason
    retired = {**moved, "old_key": None, "old_record": False}
    assert decide_refresh(old, new, retired).action == "already"
    for found, says in (({**retired, "new_key": None}, "neither a key nor a Cobbler record"),
                        ({**LIVE, "live": False}, "the ERP knows no running store server"),
                        ({**LIVE, "domain": None}, "is on neither store-0001-hv nor"),
                        ({**LIVE, "domain": {"name": "store-0001-vm", "data_disk": None}},
                         "has no data disk")):
        with pytest.raises(RefreshRefused, match=says):
            decide_refresh(old, new, found)


# -- the guard ---------------------------------------------------------------------------------
NIGHTS = CalendarSpec(time_zone="UTC", windows=["daily 22:00-06:00"])


def authorize(consent: Consent, now: datetime) -> guard.Authorization:
    return guard.authorize(Action.REFRESH_HARDWARE, INVENTORY.get("0001"), consent,
                           disruption_seconds=dict(DEFAULT_DISRUPTION_SECONDS),
                           default_calendar=NIGHTS, now=now)


def test_the_guard_wants_a_refresh_asked_for_approved_and_in_a_window_with_room() -> None:
    night = datetime(2026, 11, 27, 1, 0, tzinfo=UTC)
    asked = Consent(asked=("refresh",), policy="destructive")
    with pytest.raises(ActionRefused, match="nobody asked for it by name"):
        authorize(Consent(asked=("update",), policy="never"), night)
    for policy in ("destructive", "always"):
        with pytest.raises(ActionRefused, match="moves the store server to the new box .*"
                                                "needs an approval nobody gave"):
            authorize(asked.model_copy(update={"policy": policy}), night)
    approved = asked.model_copy(update={"approved": True, "approved_by": "ana"})
    done = authorize(approved, night)
    assert done.go and done.record["sequence_seconds"] == 1800.0
    assert DEFAULT_DISRUPTION_SECONDS[STEP_HARDWARE_REFRESH] == 1800.0
    assert authorize(Consent(asked=("refresh",), policy="never"), night).go
    # 20 min before the window closes: no room for the move's 30 min, it waits
    late = authorize(approved, datetime(2026, 11, 27, 5, 40, tzinfo=UTC))
    assert not late.go and late.wait_until == datetime(2026, 11, 27, 22, 0, tzinfo=UTC)
    assert authorize(approved, datetime(2026, 11, 27, 5, 20, tzinfo=UTC)).go
    assert timedelta(seconds=guard.sequence_seconds(
        Action.REFRESH_HARDWARE, {**DEFAULT_DISRUPTION_SECONDS, STEP_HARDWARE_REFRESH: 60})
    ) == timedelta(minutes=1)


# -- the ERP notice and the old box's retirement -----------------------------------------------
def test_the_erp_notice_is_one_per_store_and_new_box() -> None:
    from tasks.refresh_box import RefreshNotice

    def notice(mac: str, move: dict[str, Any]) -> RefreshNotice:
        return RefreshNotice(store_id="0001", site_code="S1", hypervisor="store-0001-hv-a1b2c3",
                             hypervisor_mac=mac, status=ERP_STORE_HARDWARE_REFRESHED,
                             hardware={"mac": mac}, old_mac="52:54:00:00:00:01", move=move)

    first = notice("52:54:00:a1:b2:c3", {"mode": "live"})
    assert first.idempotency_key() == notice("52:54:00:a1:b2:c3", {}).idempotency_key()
    assert first.idempotency_key() != notice("52:54:00:d4:e5:f6", {}).idempotency_key()
    assert first.payload()["status"] == "store-hardware-refreshed"
    assert first.payload()["old_hardware"] == {"mac": "52:54:00:00:00:01"}


class Master:
    """The master as the retirement's tasks use it: key states, domains per hypervisor."""

    def __init__(self, keys: dict[str, str], domains: dict[str, dict[str, Any]]) -> None:
        self.keys, self.domains, self.calls = dict(keys), domains, []  # type: list[Any]

    def key_state(self, minion: str) -> str | None:
        return self.keys.get(minion)

    def cmd(self, minion: str, fun: str, arg: Any = (), **_: Any) -> Any:
        self.calls.append((minion, fun))
        return self.domains.get(minion) if fun == "storevirt.domain_summary" else {"done": 1}

    def revoke_token(self, minion: str) -> bool:
        return False

    def delete_keys(self, minions: list[str]) -> list[str]:
        self.calls.append(("delete_keys", minions))
        return [m for m in minions if self.keys.pop(m, None)]


def test_the_old_box_keeps_the_vm_unless_the_new_box_runs_it(monkeypatch: Any) -> None:
    import logging

    import tasks.refresh_box as module

    monkeypatch.setattr(module, "get_run_logger", lambda: logging.getLogger("test"))
    old = INVENTORY.get("0001")
    new = refreshed_store(old, NEW)
    keys = {old.hypervisor_minion_id: "accepted", new.hypervisor_minion_id: "accepted",
            old.vm_minion_id: "accepted"}
    # storevirt.domain_summary's shape (salt_states/_utils/store_domain_inspect.py summary)
    for there in (None, {"name": "store-0001-vm", "active": False, "autostart": True}):
        master = Master(keys, {new.hypervisor_minion_id: there} if there else {})
        monkeypatch.setattr(module, "master_client", lambda _config, m=master: m)
        with pytest.raises(module.NotOnNewBox, match="keeps the VM and its disks"):
            module.forget_moved_vm.fn(old, new, salt=_salt())
        assert (old.hypervisor_minion_id, "storevirt.forget_moved") not in master.calls
    master = Master(keys, {new.hypervisor_minion_id: {"name": "store-0001-vm", "active": True,
                                                      "autostart": True}})
    monkeypatch.setattr(module, "master_client", lambda _config: master)
    module.forget_moved_vm.fn(old, new, salt=_salt())
    assert master.calls[-1] == (old.hypervisor_minion_id, "storevirt.forget_moved")
    done = module.delete_old_hypervisor_key.fn(old, new, salt=_salt())
    assert done["keys_deleted"] == [old.hypervisor_minion_id]
    assert set(master.keys) == {new.hypervisor_minion_id, old.vm_minion_id}  # the VM's stays


def _salt() -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(salt_master_config="/dev/null")


# -- the command -------------------------------------------------------------------------------
def test_the_cli_refuses_another_stores_box_before_anything(tmp_path: Path,
                                                            monkeypatch: Any) -> None:
    import flows.hardware_refresh
    import tasks.preflight
    from app.cli import app

    def touched(*_: Any, **__: Any) -> None:
        raise AssertionError("nothing may start for a refused refresh")

    monkeypatch.setattr(flows.hardware_refresh, "store_hardware_refresh", touched)
    monkeypatch.setattr(tasks.preflight, "preflight", lambda *_: None)
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"stores": [store("0001"), store("0002")]}))
    env = {"STORE_ROLLOUT_SETTINGS_FILE": "", "STORE_ROLLOUT_SALT_MASTER_CONFIG": "/dev/null",
           "STORE_ROLLOUT_SALT_MASTER_ADDRESS": "127.0.0.1",
           "STORE_ROLLOUT_COBBLER_URL": "https://c.invalid/", "STORE_ROLLOUT_COBBLER_USER": "u",
           "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK": "p", "STORE_ROLLOUT_ERP_URL": "https://e.invalid",
           "STORE_ROLLOUT_ERP_TOKEN_BLOCK": "t", "STORE_ROLLOUT_IMAGE_BASE_URL": "https://i.invalid"}
    base = ["refresh", "0001", "--inventory", str(path), "--bmc-address", "10.0.9.1"]
    result = CliRunner().invoke(app, [*base, "--mac", "52:54:00:00:00:02", "--yes"], env=env)
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert "refresh --mac 52:54:00:00:00:02: store 0002's box in the inventory" in text
    assert "nothing changed" in text
    # a box of its own, without --yes: what it does and the window it needs, then it stops
    result = CliRunner().invoke(app, [*base, "--mac", NEW["mac"]], env=env)
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert guard.WHAT[Action.REFRESH_HARDWARE] in text and "needs 30 min" in text
    assert "add --yes to go on" in text


# -- the flow's order: the old box retired only after the new box's gate -----------------------
@pytest.mark.parametrize("gate_fails", [True, False])
def test_the_old_box_is_retired_only_after_the_gate_on_the_new_box(monkeypatch: Any,
                                                                   gate_fails: bool) -> None:
    from types import SimpleNamespace

    import flows.hardware_refresh as module
    from store_rollout.steps import StepClock

    calls: list[Any] = []

    def step(name: str, fails: bool = False) -> Any:
        def run(*args: Any, **_: Any) -> dict[str, Any]:
            calls.append((name, args[-1] if name == "move_store_vm" else None))
            if fails:
                raise RuntimeError(f"{name} failed: check pos")
            return {"mode": "live", "downtime_seconds": 0.4}
        return run

    monkeypatch.setattr(module, "move_store_vm", step("move_store_vm"))
    monkeypatch.setattr(module, "wait_vm_back", step("vm_back"))
    monkeypatch.setattr(module, "go_live_gate", step("gate", gate_fails))
    monkeypatch.setattr(module, "retire", step("retire"))
    monkeypatch.setattr(module, "new_box_ready", lambda *_: {"new": {"address": "10.0.9.5"}})
    monkeypatch.setattr(module, "update_window", lambda *_: {"window": {"go": True},
                                                             "authorization": {"go": True}})
    monkeypatch.setattr(module, "run_in_window", lambda _store, go, slot=None: go())
    old = INVENTORY.get("0001")
    run = module.RefreshRun(old, refreshed_store(old, NEW), SimpleNamespace(salt=None, calendar=None),
                            None, StepClock("0001"), lambda: Consent(asked=("refresh",)),
                            {"vm_back_timeout": 5.0})  # type: ignore[arg-type]
    done = module.refresh(run, {})
    assert calls[0] == ("move_store_vm", "10.0.9.5")  # the new box's address from its TLS
    if gate_fails:
        assert done["outcome"] == "failed" and [c[0] for c in calls] == [
            "move_store_vm", "vm_back", "gate"]
        assert done["failed_check"] == "the go-live gate on the new box: gate failed: check pos"
    else:
        assert done["outcome"] == "refreshed" and calls[-1][0] == "retire"


def test_a_boxs_libvirt_lets_in_its_own_stores_boxes_only() -> None:
    # libvirt matches tls_allowed_dn_list with glob * and ? (g_pattern_match_simple); a
    # `store-12-hv*` would have let store 123's boxes into store 12's
    from fnmatch import fnmatchcase

    from store_rollout.contracts import LIBVIRT_TLS_ALLOWED_DNS

    def admitted(store_id: str, minion: str) -> bool:
        return any(fnmatchcase(f"O=store-rollout,CN={minion}", dn % store_id)
                   for dn in LIBVIRT_TLS_ALLOWED_DNS)

    assert admitted("12", "store-12-hv") and admitted("12", "store-12-hv-a1b2c3")
    for other in ("store-123-hv", "store-123-hv-a1b2c3", "store-12-x-hv", "store-12-hv-a1b2c3d",
                  "store-12-vm", "store-1-hv"):
        assert not admitted("12", other), other


@pytest.mark.parametrize("on_new_box", ["defined", "running", "nothing"])
def test_a_failed_offline_move_starts_the_vm_again_on_the_old_box(monkeypatch: Any,
                                                                  on_new_box: str) -> None:
    # the Xen path shut the store down before the copy: a failure before the VM runs on the
    # new box must not leave it down, nor ever start a second copy
    import logging

    import tasks.box_move as module

    monkeypatch.setattr(module, "get_run_logger", lambda: logging.getLogger("test"))
    old = INVENTORY.get("0001")
    new = refreshed_store(old, NEW)
    calls: list[tuple[str, str]] = []

    class Boxes:
        def cmd(self, minion: str, fun: str, arg: Any = (), **_: Any) -> Any:
            calls.append((minion, fun))
            if fun == "storevirt.move_state":
                return {"running": on_new_box == "running", "defined": on_new_box != "nothing"}
            if fun == "storevirt.domain_summary":  # the old box's domain: running once started
                return {"name": old.vm_name,
                        "active": (old.hypervisor_minion_id, "virt.start") in calls}
            return True

    cause = RuntimeError("sha256 differ")
    with pytest.raises(Exception) as raised:
        module.back_on_old_box(Boxes(), old, new, cause)  # type: ignore[arg-type]
    if on_new_box == "running":
        assert raised.value is cause and (old.hypervisor_minion_id, "virt.start") not in calls
        assert (new.hypervisor_minion_id, "virt.undefine") not in calls
    else:
        assert isinstance(raised.value, module.MoveFailed)
        assert "runs again on the old box" in str(raised.value)
        assert (old.hypervisor_minion_id, "virt.start") in calls
        assert ((new.hypervisor_minion_id, "virt.undefine") in calls) == (on_new_box == "defined")
