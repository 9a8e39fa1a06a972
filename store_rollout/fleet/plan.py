"""What a rollout of a store started now would do, step by step (`store-rollout plan`).

Each step's "already done" test is store_rollout/step_rules.py's, the one its task acts on;
this module only says what the step would do about it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from store_rollout import contracts, data_disk, step_rules
from store_rollout.fleet.facts import StoreFacts, base_key_of


class StepPlan(BaseModel):
    step: str
    todo: bool
    action: str
    details: list[str] = Field(default_factory=list)
    # False when the step's work happens in a later step (a cached image's transfer: step 5),
    # so a rerun is not said to resume here
    resumes_here: bool = True
    # it destroys something that works (store_rollout/approval_policy.py asks first)
    destructive: bool = False


def _short(key: str | None) -> str:
    return (key or "?")[:12]


def _image(f: StoreFacts) -> StepPlan:
    built = (f"cache hit {_short(f.image_key)}" if f.image_cached
             else f"build {_short(f.image_key)} ({f.image_builder} builder)")
    details = [f"image key {f.image_key}"]
    if f.domain_known and step_rules.domain_reusable(f.domain):
        transfer = False
        details.append(f"transfer: no, domain {f.domain_name} exists and is reused")
    elif f.base_image_on_hypervisor:
        transfer = False
        details.append(f"transfer: no, {f.hypervisor} has the base image")
    else:
        transfer = True
        details.append(f"transfer: yes, {f.hypervisor} downloads it in step 5"
                       + ("" if f.hypervisor_answering else " (host not answering now)"))
    return StepPlan(step=contracts.STEP_IMAGE, todo=not f.image_cached or transfer,
                    action=built + ("; transfer to the hypervisor" if transfer else ""),
                    details=details, resumes_here=not f.image_cached)


def _pxe(f: StoreFacts) -> StepPlan:
    netboot = {True: "on", False: "off", None: "-"}[f.cobbler_netboot]
    if f.installed:
        details = [f"Cobbler system {f.cobbler_system}: "
                   + (f"exists, netboot {netboot}" if f.cobbler_record else "none")]
        if f.cobbler_netboot:
            details.append("netboot is on: a power cycle would reinstall this host")
        if f.silent:
            details.append(f"{f.hypervisor} does not answer now: silent, never reinstalled "
                           "(powered on from its disk if its BMC says it is off)")
        state = ("ready" if f.hypervisor_ready else ", silent" if f.silent
                 else ", not ready yet (step 3 waits)")
        return StepPlan(step=contracts.STEP_PXE_INSTALL_HYPERVISOR, todo=False,
                        action=f"none: hypervisor installed{' and ' if f.hypervisor_ready else ''}"
                               f"{state}", details=details)
    if f.install_underway:
        return StepPlan(step=contracts.STEP_PXE_INSTALL_HYPERVISOR, todo=False,
                        action="none: its install is underway (no second power cycle)",
                        details=[f"{f.cobbler_system} powered on into its install at "
                                 f"{f.power_cycled_at:%Y-%m-%d %H:%M:%S} UTC and on now; step 3 "
                                 "waits for that install"])
    if not f.cobbler_record:
        record = f"create Cobbler system {f.cobbler_system}"
    elif f.cobbler_changes:
        record = f"update Cobbler system {f.cobbler_system} ({len(f.cobbler_changes)} fields)"
    else:
        record = f"Cobbler system {f.cobbler_system} unchanged"
    details = [*f.cobbler_changes,
               f"netboot: on (now {netboot})" if f.cobbler_record else "netboot: on",
               f"sync system {f.cobbler_system}",
               "network boot and power cycle through the host's BMC (PXE install)"]
    if f.hypervisor_key:
        details.append(f"delete hypervisor key {f.hypervisor} ({f.hypervisor_key})")
    details.append(f"issue a one-time autosign token for {f.hypervisor}")
    return StepPlan(step=contracts.STEP_PXE_INSTALL_HYPERVISOR, todo=True,
                    action=f"{record}; netboot on; sync; BMC power cycle", details=details)


def _highstate_details(f: StoreFacts) -> list[str]:
    if f.highstate_changes is None:
        return [f"highstate test=True: {f.highstate_note or 'not checked'}"]
    if not f.highstate_changes:
        return ["highstate test=True: no changes"]
    return [f"highstate test=True: {len(f.highstate_changes)} states would change",
            *f.highstate_changes]


def _wait(f: StoreFacts) -> StepPlan:
    if f.wrong_hardware:
        return StepPlan(step=contracts.STEP_WAIT_FOR_HYPERVISOR, todo=True,
                        action=f"fails: {f.hypervisor} reports serial {f.hypervisor_serial!r}, "
                        f"the inventory's hypervisor.serial is {f.expected_serial!r}",
                        details=["steps 4 to 8 do not run on another box than the store's"])
    if f.silent:
        return StepPlan(step=contracts.STEP_WAIT_FOR_HYPERVISOR, todo=True,
                        action="wait for the silent host to answer (installed: never "
                               "reinstalled)",
                        details=[f"{f.hypervisor}: key accepted, install finished in Cobbler, "
                                 "no answer now; the step fails after its timeout naming how "
                                 "long it was silent"])
    if f.installed and f.hypervisor_ready:
        details = _highstate_details(f)
        if f.highstate_changes:
            details.append("a rollout does not reapply the highstate of a ready host")
        return StepPlan(step=contracts.STEP_WAIT_FOR_HYPERVISOR, todo=False,
                        action="none: hypervisor ready", details=details)
    if f.hypervisor_answering:
        return StepPlan(step=contracts.STEP_WAIT_FOR_HYPERVISOR, todo=True,
                        action="wait for the ready event (host up, not ready)",
                        details=_highstate_details(f))
    return StepPlan(step=contracts.STEP_WAIT_FOR_HYPERVISOR, todo=True,
                    action="wait for the install and the first highstate",
                    details=[f"{f.hypervisor} does not answer now"])


def _keys(f: StoreFacts) -> StepPlan:
    if step_rules.vm_key_kept(f.domain, f.vm_key):
        return StepPlan(step=contracts.STEP_PREPARE_VM_KEYS, todo=False,
                        action=f"none: {f.domain_name} exists, key {f.vm} accepted")
    details = ([f"delete VM key {f.vm} ({f.vm_key})"] if f.vm_key else
               [f"no key of {f.vm} to delete"])
    details.append(f"issue a one-time autosign token for {f.vm} (accepted at its first contact)")
    return StepPlan(step=contracts.STEP_PREPARE_VM_KEYS, todo=True,
                    action="delete the stale VM key; issue a token" if f.vm_key
                    else "issue a one-time token", details=details)


def _create_vm(f: StoreFacts) -> StepPlan:
    if step_rules.domain_reusable(f.domain):
        return _reuse_vm(f, f.domain)
    details = [f"virt.init {f.domain_name} (start=False) on an overlay of image "
               f"{_short(f.image_key)}", "write its identity seed", "virt.start"]
    if not f.domain_known:
        details.insert(0, f"{f.hypervisor} does not answer now: domain assumed missing")
    return StepPlan(step=contracts.STEP_CREATE_VM, todo=True, action=f"create {f.domain_name}",
                    details=details)


def _reuse_vm(f: StoreFacts, domain: dict[str, Any]) -> StepPlan:
    details = [f"uuid {f.domain_uuid}, disk {domain.get('disk')}"]
    base = base_key_of(domain.get("backing"))
    if base and base != f.image_key:
        details.append(f"its disk is on image {_short(base)}, the current image is "
                       f"{_short(f.image_key)}: reused as is (roll the store back to move it)")
    todo, actions = False, []
    if step_rules.seed_needed(domain, f.vm):
        todo = True
        actions.append("seed its identity")
    if step_rules.start_needed(domain):
        todo = True
        actions.append("start it (virt.start)")
    else:
        actions.append("running")
    return StepPlan(step=contracts.STEP_CREATE_VM, todo=todo,
                    action=f"reuse {f.domain_name}: " + ", ".join(actions), details=details)


def _firstboot(f: StoreFacts) -> StepPlan:
    if f.firstboot_done:
        if f.domain is not None and (f.domain.get("seed") or {}).get("attached"):
            return StepPlan(step=contracts.STEP_FIRSTBOOT, todo=True,
                            action="firstboot done; retire the identity seed")
        return StepPlan(step=contracts.STEP_FIRSTBOOT, todo=False, action="none: firstboot done")
    if f.vm_answering:
        return StepPlan(step=contracts.STEP_FIRSTBOOT, todo=True,
                        action=f"continue firstboot from stage {f.firstboot_stage}")
    if f.domain is None:
        return StepPlan(step=contracts.STEP_FIRSTBOOT, todo=True,
                        action="firstboot: reboot, highstate, report, reboot and verify")
    return StepPlan(step=contracts.STEP_FIRSTBOOT, todo=True,
                    action=f"wait for {f.vm} to answer (it does not now)",
                    details=[f"its key: {f.vm_key or 'none'}"])


def _go_live(f: StoreFacts) -> StepPlan:
    """The gate only reads; it has passed when the ERP holds this VM's notice (a rerun checks
    again)."""
    checks = "check the store server: its services, ports, disk and clock"
    notice = None if f.erp_error else f.notice_for_vm()
    if notice is not None:
        return StepPlan(step=contracts.STEP_GO_LIVE, todo=False,
                        action=f"none: passed before ERP notice {notice['id']}",
                        details=[f"a rerun would {checks} again"])
    return StepPlan(step=contracts.STEP_GO_LIVE, todo=True, action=checks)


def _erp(f: StoreFacts) -> StepPlan:
    if f.erp_error:
        return StepPlan(step=contracts.STEP_NOTIFY_ERP, todo=True,
                        action="notice (ERP not readable)", details=[f.erp_error])
    notice = f.notice_for_vm()
    if notice is not None:
        return StepPlan(step=contracts.STEP_NOTIFY_ERP, todo=False,
                        action=f"none: replay keeps ERP id {notice['id']}")
    details = [f"ERP id {n['id']} is for an earlier VM (uuid {n.get('vm_uuid')})"
               for n in f.erp_notices]
    return StepPlan(step=contracts.STEP_NOTIFY_ERP, todo=True,
                    action="new notice" + (" for the new VM" if f.erp_notices else ""),
                    details=details)


def plan_store(f: StoreFacts, recreate_vm: bool = False,
               reinstall_hypervisor: bool = False, replace_box: bool = False) -> list[StepPlan]:
    """What a rollout of this store started now would do, step by step; with `recreate_vm`,
    one that recreates the store's VM (step 5 removes the domain there, then goes on as for
    a store without one); with `reinstall_hypervisor`, one that reinstalls its host (step 2,
    then everything on the new install: a new VM, its key, its notice); with `replace_box`
    (`f` observed with the new box's fields), one that moves the store to a new box."""
    if replace_box:
        return _replace(f)
    if reinstall_hypervisor and step_rules.reinstall_due(f.installed, f.power_cycled_at,
                                                         datetime.now(UTC)):
        return _reinstall(f)
    if recreate_vm and f.domain is not None:
        return [_image(f), _pxe(f), _wait(f), _keys_kept_for_recreation(f), _recreate_vm(f),
                *_after_recreation(f)]
    return [_image(f), _pxe(f), _wait(f), _keys(f), _create_vm(f), _firstboot(f), _go_live(f),
            _erp(f)]


def _reinstall(f: StoreFacts) -> list[StepPlan]:
    """Step 2 reinstalls the running host (its disk and the store VM on it are wiped), then the
    steps after it as for a host that was never installed."""
    wiped = f.model_copy(update=dict(
        hypervisor_key=None, hypervisor_ready=False, hypervisor_answering=False,
        highstate_changes=None, base_image_on_hypervisor=False, domain=None, domain_known=True,
        vm_answering=False, firstboot_stage=None, power_cycled_at=None))
    pxe = _pxe(wiped)
    running = f" and its store server {f.domain_name}" if f.domain is not None else ""
    reinstall = pxe.model_copy(update=dict(
        destructive=True, action=f"reinstall {f.hypervisor}: {pxe.action}",
        details=[f"{f.hypervisor} is installed and ready: the install wipes its disk{running}",
                 data_disk.lost_with_host(f.hypervisor, (f.domain or {}).get("data_disk")),
                 *pxe.details, f"delete hypervisor key {f.hypervisor} ({f.hypervisor_key})"]))
    return [_image(wiped), reinstall, _wait(wiped), _keys(wiped), _create_vm(wiped),
            _firstboot(wiped), _go_live(wiped), _erp(wiped)]


def _replace(f: StoreFacts) -> list[StepPlan]:
    """Step 2 retires the old box and installs the new one, then everything on the new box."""
    steps = _reinstall(f)
    install = _pxe(f.model_copy(update=dict(hypervisor_key=None, hypervisor_ready=False,
                                            power_cycled_at=None)))
    new_box = steps[1].model_copy(update=dict(
        action=f"retire the old box, install the new one: {install.action}",
        details=["the old box powered off through its BMC (if it answers); the keys of "
                 f"{f.hypervisor} and {f.vm} deleted in one call",
                 data_disk.left_on_old_box(f.hypervisor, (f.domain or {}).get("data_disk")),
                 *[d for d in steps[1].details if not d.startswith(f"{f.hypervisor} is ")
                   and not d.startswith(("delete hypervisor key", "the store's data disk"))]]))
    return [steps[0], new_box, *steps[2:]]


def _keys_kept_for_recreation(f: StoreFacts) -> StepPlan:
    return StepPlan(step=contracts.STEP_PREPARE_VM_KEYS, todo=False,
                    action=f"none: step 5 replaces {f.vm}'s key once its VM is removed")


def _recreate_vm(f: StoreFacts) -> StepPlan:
    domain = f.domain or {}
    return StepPlan(step=contracts.STEP_CREATE_VM, todo=True, destructive=True,
                    action=f"recreate {f.domain_name}: remove the running store server and "
                           "create it anew",
                    details=[f"remove domain {f.domain_name} (uuid {f.domain_uuid}) and its "
                             f"system disk {domain.get('disk')}",
                             data_disk.kept(f.hypervisor, domain.get("data_disk")),
                             f"delete VM key {f.vm} ({f.vm_key or 'none'}); issue a one-time "
                             "token",
                             f"virt.init {f.domain_name} (start=False) on an overlay of image "
                             f"{_short(f.image_key)}", "write its identity seed", "virt.start"])


def _after_recreation(f: StoreFacts) -> list[StepPlan]:
    """Steps 6 to 8 for the new VM: its firstboot, its go-live gate, a new ERP notice (a new
    uuid)."""
    anew = f.model_copy(update=dict(domain=None, vm_key=None, vm_answering=False,
                                    firstboot_stage=None))
    return [_firstboot(anew), _go_live(anew), _erp(anew)]


def first_todo(plan: list[StepPlan]) -> tuple[int, str] | None:
    """(1-based number, name) of the first step with something to do there (where a rerun
    resumes); None when none has."""
    return next(((contracts.STEPS.index(p.step) + 1, p.step) for p in plan
                 if p.todo and p.resumes_here), None)
