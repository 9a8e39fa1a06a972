"""plan and reconcile rules (store_rollout/fleet/) on facts built by hand, and the pure
helpers of tasks/observe.py and tasks/cobbler/ they rest on. The lab tests
(tests/lab/test_plan_reconcile.py) check the same conclusions on real systems."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from store_rollout.contracts import (
    STEP_CREATE_VM,
    STEP_FIRSTBOOT,
    STEP_GO_LIVE,
    STEP_NOTIFY_ERP,
    STEP_PXE_INSTALL_HYPERVISOR,
    STEPS,
)
from store_rollout.fleet.facts import LastRun, StoreFacts, base_key_of
from store_rollout.fleet.plan import first_todo, plan_store
from store_rollout.fleet.reconcile import reconcile_store
from store_rollout.fleet.render import plan_markdown, reconcile_table
from tasks.cobbler import SystemSpec, record_fields, spec_fields, system_changes
from tasks.observe import highstate_changes

KEY = "ab" * 32
UUID = "6f1c0d7e-0000-4000-8000-000000000042"
ZOMBIE = 90.0


def fresh(**changes: Any) -> StoreFacts:
    """A store nothing has happened to yet (image built, ERP empty)."""
    facts = StoreFacts(store_id="0042", hypervisor="store-0042-hv", vm="store-0042-vm",
                       domain_name="store-0042-vm", cobbler_system="store-0042-hv",
                       image_key=KEY, image_cached=True, image_builder="lab",
                       cobbler_record=False, cobbler_changes=["profile: 'leap' (new)"])
    return facts.model_copy(update=changes)


def rolled_out(**changes: Any) -> StoreFacts:
    """A store whose rollout completed: everything in place, the ERP notified of this VM."""
    domain = {"name": "store-0042-vm", "uuid": UUID, "active": True,
              "disk": "/srv/images/store-0042-vm/system.qcow2",
              "backing": f"/srv/images/base/{KEY}/image.qcow2",
              "seed": {"minion_id": "store-0042-vm", "state": "retired", "attached": False}}
    facts = fresh(cobbler_record=True, cobbler_netboot=False, cobbler_changes=[],
                  hypervisor_key="accepted", hypervisor_answering=True, hypervisor_ready=True,
                  highstate_changes=[], base_image_on_hypervisor=True, domain=domain,
                  domain_known=True, vm_key="accepted", vm_answering=True,
                  firstboot_stage="done",
                  erp_notices=[{"id": "ERP-1", "idempotency_key": "k", "vm_uuid": UUID}],
                  last_run=LastRun(id="r1", name="rollout-0042", state="Completed"))
    return facts.model_copy(update=changes)


def todo(facts: StoreFacts) -> list[str]:
    return [p.step for p in plan_store(facts) if p.todo]


def test_a_fresh_store_has_all_eight_steps_to_do() -> None:
    plan = plan_store(fresh())
    assert [p.step for p in plan] == list(STEPS)
    assert todo(fresh()) == list(STEPS)
    assert "transfer to the hypervisor" in plan[0].action  # cached, but not on the host yet
    assert plan[1].action.startswith("create Cobbler system store-0042-hv")
    assert plan[6].action == "check the store server: its services, ports, disk and clock"
    assert plan[7].action == "new notice"
    # the image is cached: its transfer happens in step 5, so a rerun resumes at step 2
    assert first_todo(plan) == (2, "pxe_install_hypervisor")
    assert first_todo(plan_store(fresh(image_cached=False))) == (1, "image")


def test_a_rolled_out_store_has_nothing_to_do() -> None:
    plan = plan_store(rolled_out())
    assert todo(rolled_out()) == [], plan
    assert plan[6].action == "none: passed before ERP notice ERP-1"
    assert plan[7].action == "none: replay keeps ERP id ERP-1"
    assert first_todo(plan) is None
    assert "nothing to do" in plan_markdown({"0042": plan})


def test_a_vm_destroyed_by_hand_has_only_vm_and_firstboot_to_do() -> None:
    stopped = rolled_out(domain={**rolled_out().domain, "active": False},  # type: ignore[dict-item]
                         vm_answering=False, firstboot_stage=None)
    assert todo(stopped) == [STEP_CREATE_VM, STEP_FIRSTBOOT]
    assert plan_store(stopped)[4].action == "reuse store-0042-vm: start it (virt.start)"


def test_an_image_change_builds_and_transfers_but_an_existing_vm_keeps_its_disk() -> None:
    new_key = "cd" * 32
    facts = rolled_out(image_key=new_key, image_cached=False, base_image_on_hypervisor=False)
    plan = plan_store(facts)
    assert plan[0].todo and plan[0].action.startswith(f"build {new_key[:12]}")
    assert "transfer: no, domain store-0042-vm exists" in plan[0].details[1]
    assert any("reused as is" in d for d in plan[4].details)
    assert base_key_of(f"/x/base/{KEY}/image.qcow2") == KEY


def test_an_installed_host_is_not_reinstalled_and_drift_is_only_reported() -> None:
    facts = rolled_out(highstate_changes=["hypervisor-checks: would change"],
                       cobbler_netboot=True)
    plan = plan_store(facts)
    assert not plan[1].todo and not plan[2].todo
    assert "netboot is on: a power cycle would reinstall this host" in plan[1].details
    assert "hypervisor-checks: would change" in plan[2].details


def test_reconcile_of_a_complete_rollout_finds_nothing() -> None:
    status = reconcile_store(rolled_out(), ZOMBIE)
    assert (status.status, status.mismatches) == ("ok", [])
    assert status.real == "hypervisor ready; VM running, firstboot done; ERP notified"


def test_reconcile_of_a_rollout_killed_after_step_5() -> None:
    killed = rolled_out(vm_answering=True, firstboot_stage="highstate", erp_notices=[],
                        last_run=LastRun(id="r1", name="rollout-0042", state="Crashed"))
    killed.domain["seed"]["attached"] = True  # type: ignore[index]
    status = reconcile_store(killed, ZOMBIE)
    assert [m.code for m in status.mismatches] == ["run-not-completed"]
    assert status.mismatches[0].fix == "`store-rollout rollout 0042` resumes at step 6 (firstboot)"


def test_reconcile_of_a_vm_destroyed_by_hand() -> None:
    stopped = rolled_out(domain={**rolled_out().domain, "active": False},  # type: ignore[dict-item]
                         vm_answering=False, firstboot_stage=None)
    status = reconcile_store(stopped, ZOMBIE)
    assert [m.code for m in status.mismatches] == ["vm-stopped"]
    assert "starts it (step 5)" in status.mismatches[0].fix
    gone = rolled_out(domain=None, vm_answering=False, firstboot_stage=None)
    status = reconcile_store(gone, ZOMBIE)
    assert [m.code for m in status.mismatches] == ["domain-missing"]
    assert "the ERP was notified (ERP-1)" in status.mismatches[0].what
    assert "resumes at step 4 (prepare_vm_keys)" in status.mismatches[0].fix


def test_reconcile_of_a_missing_erp_notice() -> None:
    status = reconcile_store(rolled_out(erp_notices=[]), ZOMBIE)
    assert [m.code for m in status.mismatches] == ["erp-not-notified"]
    assert status.mismatches[0].what == "VM running, firstboot done, ERP not notified of this VM"
    assert status.mismatches[0].fix == "`store-rollout rollout 0042` resumes at step 7 (go_live)"
    crashed = rolled_out(erp_notices=[], last_run=LastRun(id="r", name="rollout-0042",
                                                          state="Crashed"))
    status = reconcile_store(crashed, ZOMBIE)
    assert status.mismatches[0].what == "VM running, firstboot done, ERP not notified"
    assert status.mismatches[0].fix.endswith("resumes at step 7 (go_live)")


def test_reconcile_of_runs_without_a_process_and_systems_without_a_run() -> None:
    zombie = rolled_out(last_run=LastRun(id="r", name="rollout-0042", state="Running",
                                         heartbeat_age=400))
    assert [m.code for m in reconcile_store(zombie, ZOMBIE).mismatches] == ["zombie-run"]
    alive = zombie.model_copy(update={"last_run": zombie.last_run.model_copy(  # type: ignore[union-attr]
        update={"heartbeat_age": 12})})
    assert reconcile_store(alive, ZOMBIE).status == "running"
    orphan = rolled_out(last_run=None)
    status = reconcile_store(orphan, ZOMBIE)
    assert [m.code for m in status.mismatches] == ["no-run"]
    assert "finds nothing to do" in status.mismatches[0].fix
    assert reconcile_store(fresh(), ZOMBIE).status == "not-started"
    done_but_failed = rolled_out(last_run=LastRun(id="r", name="rollout-0042", state="Failed"))
    assert [m.code for m in reconcile_store(done_but_failed, ZOMBIE).mismatches] == [
        "complete-run-not-completed"]


def test_reconcile_fingerprint_changes_with_the_store() -> None:
    ok = reconcile_store(rolled_out(), ZOMBIE)
    broken = reconcile_store(rolled_out(erp_notices=[]), ZOMBIE)
    assert ok.fingerprint() == "ok" and broken.fingerprint() == "mismatch/erp-not-notified"
    row = reconcile_table([broken])[0]
    assert row["fix"].endswith("step 7 (go_live)") and row["fingerprint"] == broken.fingerprint()


def test_reinstalling_a_ready_host_is_destructive_and_redoes_everything_on_it() -> None:
    plan = plan_store(rolled_out(), reinstall_hypervisor=True)
    assert [p.step for p in plan if p.destructive] == [STEP_PXE_INSTALL_HYPERVISOR]
    # all of them: even the cached image goes to the wiped host again (in step 5)
    assert [p.step for p in plan if p.todo] == list(STEPS), plan
    assert "transfer to the hypervisor" in plan[0].action
    pxe = plan[1]
    assert pxe.action.startswith("reinstall store-0042-hv: "), pxe.action
    assert any("wipes its disk and its store server" in d for d in pxe.details), pxe.details
    assert "delete hypervisor key store-0042-hv (accepted)" in pxe.details
    assert plan[3].action == "delete the stale VM key; issue a token"
    assert plan[4].action.startswith("create ")
    assert plan[7].action == "new notice for the new VM"
    # a host that is not installed is installed by any rollout: nothing more to say
    assert plan_store(fresh(), reinstall_hypervisor=True) == plan_store(fresh())
    # and the run that reinstalled it, again, does not reinstall it twice
    again = rolled_out(power_cycled_at=datetime.now(UTC) + timedelta(minutes=1))
    assert not any(p.destructive for p in plan_store(again, reinstall_hypervisor=True))


def test_a_new_notice_names_the_earlier_vms_notice() -> None:
    facts = rolled_out(domain={**rolled_out().domain, "uuid": "new-uuid"})  # type: ignore[dict-item]
    gate, erp = plan_store(facts)[6:]
    assert (gate.step, gate.todo) == (STEP_GO_LIVE, True)  # not passed for this VM yet
    assert (erp.step, erp.todo, erp.action) == (STEP_NOTIFY_ERP, True, "new notice for the new VM")
    assert erp.details == [f"ERP id ERP-1 is for an earlier VM (uuid {UUID})"]


# -- Cobbler's field-by-field diff -------------------------------------------------------------

SPEC = SystemSpec(name="store-0042-hv", hostname="hv42.example", mac="52:54:00:AA:00:42",
                  profile="leap", ip="10.0.42.2", netmask="255.255.255.0", gateway="10.0.42.1",
                  autoinstall_meta={"minion_id": "store-0042-hv", "autosign_token": "t-1"})


def as_record(spec: SystemSpec) -> dict[str, Any]:
    """What Cobbler's get_system returns for a record upsert_system wrote from `spec`."""
    return {"name": spec.name, "profile": spec.profile, "hostname": spec.hostname,
            "gateway": spec.gateway, "netboot_enabled": True, "power_type": "ipmilanplus",
            "power_address": "", "power_user": "", "power_pass": "", "power_id": "",
            "autoinstall_meta": dict(spec.autoinstall_meta),
            "interfaces": {"eth0": {"mac_address": spec.mac.lower(), "dns_name": spec.hostname,
                                    "static": True, "ip_address": spec.ip,
                                    "netmask": spec.netmask, "virt_bridge": "xenbr0"}}}


def test_cobbler_diff_is_field_by_field_and_never_shows_secrets() -> None:
    assert system_changes(SPEC, as_record(SPEC)) == []
    record = as_record(SPEC)
    record["profile"] = "old"
    record["power_pass"] = "s3cret"  # an older release's record held the BMC's: it is cleared
    record["autoinstall_meta"]["autosign_token"] = "an-older-token"  # one-time: not a change
    record["interfaces"]["eth0"]["ip_address"] = "10.0.42.9"
    described = [c.describe() for c in system_changes(SPEC, record)]
    assert described == ["profile: 'old' -> 'leap'",
                         "interfaces.eth0.ip_address: '10.0.42.9' -> '10.0.42.2'",
                         "power_pass: changes (secret, not shown)"]
    assert not any("s3cret" in d or "other" in d for d in described)
    created = system_changes(SPEC, None)
    assert {c.field for c in created} == set(spec_fields(SPEC)) - {"autoinstall_meta.autosign_token"}
    assert "profile: 'leap' (new)" in [c.describe() for c in created]
    assert record_fields(as_record(SPEC))["interfaces.eth0.mac_address"] == "52:54:00:aa:00:42"


def test_highstate_changes_lists_would_be_changes_but_not_announcements() -> None:
    ret = {
        "grains_|-hypervisor-ready-init-grains-present_|-g_|-present": {
            "__id__": "hypervisor-ready-init-grains-present", "result": True, "changes": {},
            "comment": "Grain is already set", "__run_num__": 2},
        "event_|-hypervisor-ready-init-event-send_|-store/hypervisor/ready_|-send": {
            "__id__": "hypervisor-ready-init-event-send", "result": None, "changes": {},
            "comment": "Event would have been fired", "__run_num__": 3},
        "file_|-hypervisor-libvirt-conf_|-/etc/libvirt/x_|-managed": {
            "__id__": "hypervisor-libvirt-conf", "result": None, "changes": {"diff": "+a"},
            "comment": "The file /etc/libvirt/x is set to be changed", "__run_num__": 1},
    }
    assert highstate_changes(ret) == [
        "hypervisor-libvirt-conf: The file /etc/libvirt/x is set to be changed"]
    assert highstate_changes(["Rendering SLS failed"]) == ["['Rendering SLS failed']"]


def test_previous_fingerprints_come_from_the_newest_reconcile_of_each_store(
        prefect_harness: None) -> None:
    """A reconcile of a few stores (or the schedule's of another inventory) leaves the other
    stores' last fingerprints where they were: a later reconcile must not take them for new."""
    from prefect import flow
    from prefect.artifacts import create_table_artifact

    from tasks.reconcile_events import previous_reconcile

    @flow
    def reconciles() -> None:
        create_table_artifact(key="reconcile-under-test", table=[
            {"store": "a", "fingerprint": "ok"}, {"store": "b", "fingerprint": "ok"}])
        create_table_artifact(key="reconcile-under-test", table=[
            {"store": "a", "fingerprint": "mismatch/vm-stopped"}])
        create_table_artifact(key="reconcile-under-test", table=[
            {"store": "other-inventory", "fingerprint": "not-started"}])

    reconciles()
    assert previous_reconcile("reconcile-under-test") == {
        "a": "mismatch/vm-stopped", "b": "ok", "other-inventory": "not-started"}
    assert previous_reconcile("no-such-key") == {}


def test_a_decommissioned_store_is_reported_so_and_what_is_left_is_named() -> None:
    closed = {"id": "ERP-2", "idempotency_key": "d", "vm_uuid": None,
              "status": "store-decommissioned"}
    gone = fresh(erp_notices=[*rolled_out().erp_notices, closed],
                 last_run=LastRun(id="r1", name="rollout-0042", state="Completed"))
    status = reconcile_store(gone, ZOMBIE)
    assert (status.status, status.mismatches, status.real) == ("decommissioned", [],
                                                               "decommissioned")
    left = rolled_out(erp_notices=gone.erp_notices)
    status = reconcile_store(left, ZOMBIE)
    assert status.status == "mismatch"
    assert [(m.code, m.fix) for m in status.mismatches] == [(
        "decommission-incomplete", "`store-rollout decommission 0042` removes what is left")]
    assert status.mismatches[0].what == (
        "the ERP has the store's decommission, but Cobbler system store-0042-hv, the key of "
        "store-0042-hv (accepted), the key of store-0042-vm (accepted), domain store-0042-vm "
        "still exist")
    # rolled out again after its decommission: its newer notice counts, not the old closing
    reopened = rolled_out(erp_notices=[*gone.erp_notices, rolled_out().erp_notices[0]])
    assert reconcile_store(reopened, ZOMBIE).status == "ok"


def test_another_box_is_named_by_plan_and_reconcile() -> None:
    other = rolled_out(expected_serial="CZ123", hypervisor_serial="LAB525400000001")
    step3 = plan_store(other)[2]
    assert step3.todo and step3.action == (
        "fails: store-0042-hv reports serial 'LAB525400000001', the inventory's "
        "hypervisor.serial is 'CZ123'")
    assert [m.code for m in reconcile_store(other, ZOMBIE).mismatches] == ["wrong-hardware"]
    same = rolled_out(expected_serial="lab525400000001", hypervisor_serial="LAB525400000001")
    assert not plan_store(same)[2].todo and reconcile_store(same, ZOMBIE).status == "ok"
    silent = rolled_out(expected_serial="CZ123", hypervisor_answering=False)
    assert "wrong-hardware" not in [m.code for m in reconcile_store(silent, ZOMBIE).mismatches]
