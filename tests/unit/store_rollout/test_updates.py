"""Issue 47: what an image update or revert of one store decides (store_rollout/updates.py) from
what the store's systems say: the ERP, the host's domain and update record, the VM's grain; the
guard's rules for the update actions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from store_rollout import guard
from store_rollout.disruption import DEFAULT_DISRUPTION_SECONDS, STEP_IMAGE_UPDATE
from store_rollout.guard import Action, ActionRefused, Consent
from store_rollout.image_versions import ImageVersion, ImageVersionError
from store_rollout.inventory.calendar_spec import CalendarSpec
from store_rollout.updates import (
    DOWN_STEPS,
    NothingToRevert,
    decide_revert,
    decide_update,
    failed_check,
    not_live,
    report,
    seconds_of,
    target_version,
    update_notice_key,
    without_data_disk,
)
from tasks.image_update import VmNotBack
from tests.unit.store_rollout.test_step_rules import STORE

OLD, NEW = "/images/store-0042-vm/system.qcow2", "/images/store-0042-vm/system-bbbbbbbbbbbb.qcow2"
V1_KEY, V2_KEY = "a" * 64, "b" * 64


def domain(disk: str = OLD, key: str = V1_KEY, active: bool = True) -> dict[str, Any]:
    return {"name": "store-0042-vm", "disk": disk, "image_key": key, "active": active,
            "data_disk": "/srv/salt-images/store-0042-vm/data.raw"}


def record(phase: str, **more: Any) -> dict[str, Any]:
    return {"from": OLD, "to": NEW, "from_version": "v1", "to_version": "v2", "run": "r-1",
            "phase": phase, "switched_at": 1.0, **more}


# -- live or not --------------------------------------------------------------------------------

def test_only_a_live_store_is_updated() -> None:
    assert not_live(True, domain(), "accepted", "v1", None) is None
    assert "ERP knows no running store server" in str(not_live(False, domain(), "accepted", "v1",
                                                               None))
    assert "domain is not on its hypervisor" in str(not_live(True, None, "accepted", "v1", None))
    assert "key is not accepted (pending)" in str(not_live(True, domain(), "pending", "v1", None))
    assert "key is not accepted (no key)" in str(not_live(True, domain(), None, "v1", None))
    # a VM that does not answer: refused, unless a crashed update left it switched (finished)
    assert "does not answer" in str(not_live(True, domain(), "accepted", None, None))
    assert "does not answer" in str(not_live(True, domain(), "accepted", None,
                                             record("committed")))
    assert not_live(True, domain(NEW, active=False), "accepted", None, record("switched")) is None


# -- what an update does ------------------------------------------------------------------------

def test_the_same_version_on_the_same_image_is_already_there() -> None:
    done = decide_update(None, domain(NEW, V2_KEY), "v2", "v2", V2_KEY)
    assert done.action == "already" and done.from_version == done.to_version == "v2"
    # after a committed update too
    assert decide_update(record("committed"), domain(NEW, V2_KEY), "v2", "v2", V2_KEY).action \
        == "already"


def test_grain_and_disk_must_both_agree_for_already() -> None:
    # the grain says v2, but the disk is backed by another image (v2 rebuilt): updated
    rebuilt = decide_update(None, domain(NEW, "c" * 64), "v2", "v2", V2_KEY)
    assert rebuilt.action == "update"
    # the disk is v2's, the grain says v1: updated (nobody trusts the disk alone)
    assert decide_update(None, domain(NEW, V2_KEY), "v1", "v2", V2_KEY).action == "update"


def test_an_update_from_v1_and_an_unversioned_vm() -> None:
    done = decide_update(None, domain(), "v1", "v2", V2_KEY)
    assert (done.action, done.from_version, done.to_version) == ("update", "v1", "v2")
    assert decide_update(None, domain(), None, "v2", V2_KEY).from_version == "unversioned"
    # a reverted earlier attempt does not stop a new one
    assert decide_update(record("reverted"), domain(), "v1", "v2", V2_KEY).action == "update"


def test_a_switch_a_crashed_run_left_is_finished_first() -> None:
    # switched and booted (or not): checked, then committed or reverted
    done = decide_update(record("switched"), domain(NEW, V2_KEY, active=False), None, "v2",
                         V2_KEY)
    assert (done.action, done.disk, done.switch_again) == ("finish", NEW, False)
    assert (done.from_version, done.to_version) == ("v1", "v2")
    assert "run r-1 switched the system disk" in done.reason
    # recorded, but the crash came before the domain was redefined: switched again
    again = decide_update(record("switched"), domain(OLD, V1_KEY, active=False), None, "v2",
                          V2_KEY)
    assert again.action == "finish" and again.switch_again
    # whatever the run asks for now: the recorded one is finished first
    assert decide_update(record("switched"), domain(NEW), "v2", "v3", "d" * 64).to_version == "v2"


def test_a_revert_needs_a_record() -> None:
    with pytest.raises(NothingToRevert, match="store 0042: its host holds no update record"):
        decide_revert(None, "0042")
    assert decide_revert(record("committed"), "0042") == "revert"
    assert decide_revert(record("switched"), "0042") == "revert"
    assert decide_revert(record("reverted"), "0042") == "already"


def test_the_target_version() -> None:
    images = type("Images", (), {"image_description": "leap16-jeos", "image_params": {},
                                 "image_version": "v1",
                                 "image_versions": {"v1": ImageVersion(), "v2": ImageVersion()}})
    assert target_version(images, "v2", None) == "v2"
    assert target_version(images, "", None) == "v1"  # the chain's
    assert target_version(images, "", "v2") == "v2"  # the store's
    with pytest.raises(ImageVersionError, match="image_version: image version 'v9' is not in"):
        target_version(images, "v9", None)
    images.image_version = ""  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="name the version to update to"):
        target_version(images, "", None)


def test_downtime_checks_and_the_report() -> None:
    seconds = {"image": 9.0, "stage": 4.0, "shutdown": 2.0, "switch": 0.5, "boot": 1.0,
               "vm_back": 6.5, "update_highstate": 3.0}
    assert seconds_of(seconds, DOWN_STEPS) == 10.0
    assert seconds_of({"image": 1.0}, DOWN_STEPS) is None
    assert failed_check("go_live", RuntimeError("store 0042: service pos down")) == \
        "the go-live gate failed: store 0042: service pos down"
    assert failed_check("vm_back", VmNotBack("")).startswith("the VM's minion coming back failed")
    text = report("0042", {"outcome": "updated", "from_version": "v1", "to_version": "v2",
                           "downtime_seconds": 10.0, "step_seconds": seconds})
    for part in ("from version: `v1`", "to version: `v2`", "downtime (shutdown to the minion "
                 "back): 10.0 s", "| update_highstate | the update highstate"):
        assert part in text, text


def test_one_erp_notice_per_store_and_version() -> None:
    key = update_notice_key("0042", "v2")
    assert key == update_notice_key("0042", "v2") and key.startswith("store-rollout-0042-")
    assert key != update_notice_key("0042", "v3") and key != update_notice_key("0043", "v2")


# -- the guard --------------------------------------------------------------------------------

ALWAYS = CalendarSpec(time_zone="UTC", windows=["daily 00:00-24:00"])
NIGHTS = CalendarSpec(time_zone="UTC", windows=["daily 22:00-06:00"])
NOON = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def authorize(action: Action, consent: Consent, calendar: CalendarSpec | None = ALWAYS
              ) -> guard.Authorization:
    return guard.authorize(action, STORE, consent, disruption_seconds=dict(
        DEFAULT_DISRUPTION_SECONDS), default_calendar=calendar, now=NOON)


def test_an_update_is_asked_for_by_name_and_destroys_nothing() -> None:
    with pytest.raises(ActionRefused, match="nobody asked for it by name"):
        authorize(Action.UPDATE_IMAGE, Consent(policy="never"))
    # `destructive`: it goes unapproved (what it replaces is kept); `always` needs an approval
    done = authorize(Action.UPDATE_IMAGE, Consent(asked=("update",), policy="destructive"))
    assert done.go and "destroys nothing" in done.record["approval"]
    assert authorize(Action.REVERT_IMAGE, Consent(asked=("revert",), policy="destructive")).go
    with pytest.raises(ActionRefused, match="needs an approval nobody gave"):
        authorize(Action.UPDATE_IMAGE, Consent(asked=("update",), policy="always"))
    # a destructive action still needs its approval under `destructive`
    with pytest.raises(ActionRefused, match="needs an approval nobody gave"):
        authorize(Action.RECREATE_VM, Consent(asked=("recreate_vm",), policy="destructive"))


def test_an_update_waits_for_a_window_with_room_for_it() -> None:
    assert guard.sequence_seconds(Action.UPDATE_IMAGE, {**DEFAULT_DISRUPTION_SECONDS,
                                                        STEP_IMAGE_UPDATE: 600}) == 600
    waits = authorize(Action.UPDATE_IMAGE, Consent(asked=("update",), policy="never"), NIGHTS)
    assert not waits.go and waits.wait_until == NOON.replace(hour=22)
    # unproven, a run may not take a live store down outside its window
    with pytest.raises(ActionRefused, match="only a proven approver may do that"):
        authorize(Action.UPDATE_IMAGE, Consent(asked=("update",), policy="never",
                                               ignore_windows=True), NIGHTS)


def test_finishing_a_crashed_update_needs_no_request_approval_or_window() -> None:
    done = authorize(Action.FINISH_UPDATE, Consent(policy="always"), None)
    assert done.go and "finishes what an approved run began" in done.record["approval"]


# -- the flows ask the guard before their first change ------------------------------------------

class Refused(Exception):
    """The swapped guard's answer."""


@pytest.mark.parametrize("flow_module", ["flows.image_update", "flows.image_revert"])
def test_update_and_revert_refuse_when_the_guard_does(flow_module: str,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Any) -> None:
    """With guard.authorize swapped for one that refuses, neither flow stages, shuts down,
    switches, reverts or boots anything (a live store on v1 with a committed update record)."""
    import importlib
    import logging

    from tasks import image_update as tasks_module
    from tests.helpers import settings_with

    asked: list[str] = []

    def refuse(action: Action, *_: Any, **__: Any) -> Any:
        asked.append(action.value)
        raise Refused(action.value)

    module = importlib.import_module(flow_module)
    monkeypatch.setattr(guard, "authorize", refuse)
    inventory = tmp_path / "inv.yaml"
    inventory.write_text('stores: [{store_id: "0042", hypervisor: {hostname: hv.invalid, '
                         'mac: "52:54:00:42:00:01"}, erp: {site_code: DE-0042}}]')
    settings = settings_with(approval_policy="destructive", image_version="v1", image_versions={
        "v1": ImageVersion(), "v2": ImageVersion()})
    changed: list[str] = []
    monkeypatch.setattr(module, "load_settings", lambda: settings)
    for target in (module, importlib.import_module("flows.image_update")):
        monkeypatch.setattr(target, "check_region", lambda *_: None, raising=False)
        monkeypatch.setattr(target, "store_owner", lambda *_: __import__(
            "contextlib").nullcontext(), raising=False)
        monkeypatch.setattr(target, "get_run_logger", lambda: logging.getLogger("test"),
                            raising=False)
    monkeypatch.setattr(tasks_module, "get_run_logger", lambda: logging.getLogger("test"))
    state = {"domain": domain(), "record": record("committed"), "key": "accepted",
             "running_version": "v1"}
    monkeypatch.setattr(module, "read_update_state", lambda *_: state)
    monkeypatch.setattr(module, "ensure_image", lambda *_: {"key": V2_KEY}, raising=False)
    for name in ("stage_update", "shutdown_vm", "switch_disk", "boot_vm", "revert_disk",
                 "commit_update", "notify_erp_image_updated", "back_to_previous"):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, lambda *a, _n=name, **k: changed.append(_n))
    flow = module.store_image_update if flow_module.endswith("update") \
        else module.store_image_revert
    args = ("0042", str(inventory), "v2") if flow_module.endswith("update") else (
        "0042", str(inventory))
    with pytest.raises(Refused):
        flow.fn.__wrapped__(*args)  # no heartbeats
    assert asked == ["update" if flow_module.endswith("update") else "revert"]
    assert changed == []


def test_a_vm_without_a_data_disk_is_refused_naming_why() -> None:
    """A VM defined before data disks: its key and data are on the system disk an update
    replaces, and the new image's minion waits for the data disk's mount."""
    assert without_data_disk("0042", domain()) is None
    said = without_data_disk("0042", {**domain(), "data_disk": None})
    assert said is not None and "store-0042-vm has no data disk" in said
    assert "nothing changed" in said
