"""What a store looks like on the real systems, and what `plan` and `reconcile` conclude from it.

`StoreFacts` is one store as Cobbler, the Salt master (keys, grains), its hypervisor's libvirt,
the image cache, the ERP and Prefect report it (tasks/observe.py reads them, changing nothing).
`plan_store` says, step by step, what a rollout started now would do; `reconcile_store` names
each disagreement between those systems and Prefect's last rollout run, with the command that
settles it. Both are pure functions of the facts, so every rule is unit-tested without a lab.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from store_rollout.contracts import (
    FIRSTBOOT_STAGE_DONE,
    STEP_CREATE_VM,
    STEP_FIRSTBOOT,
    STEP_IMAGE,
    STEP_NOTIFY_ERP,
    STEP_PREPARE_VM_KEYS,
    STEP_PXE_INSTALL_HYPERVISOR,
    STEP_WAIT_FOR_HYPERVISOR,
    STEPS,
)

_BASE_KEY = re.compile(r"/base/(?P<key>[0-9a-f]{16,64})/image\.qcow2$")
FINAL_STATES = ("Completed", "Failed", "Crashed", "Cancelled")


class LastRun(BaseModel):
    """Prefect's newest store-rollout run of a store."""

    id: str
    name: str
    state: str  # the state's name: Completed, Failed, Crashed, Running, Scheduled...
    started: str | None = None
    # seconds since its last heartbeat (a Running run); None: none seen
    heartbeat_age: float | None = None


class StoreFacts(BaseModel):
    """One store as the real systems report it. None means "could not be read" where the
    field says so; every read is one batched call per kind (tasks/observe.py)."""

    store_id: str
    hypervisor: str
    vm: str
    domain_name: str
    cobbler_system: str
    # image step: the key a rollout would use, cached on the orchestrator or to be built
    image_key: str
    image_cached: bool
    image_builder: str
    # Cobbler
    cobbler_record: bool
    cobbler_netboot: bool | None = None
    cobbler_changes: list[str] = Field(default_factory=list)  # described, secrets masked
    # Salt: the hypervisor
    hypervisor_key: str | None = None  # accepted, pending, rejected, denied, None
    hypervisor_answering: bool = False
    hypervisor_ready: bool = False
    highstate_changes: list[str] | None = None  # test=True; None: not checked
    highstate_note: str | None = None  # why it was not checked, or its error
    # libvirt, read through the hypervisor; None when the hypervisor did not answer
    base_image_on_hypervisor: bool | None = None
    domain: dict[str, Any] | None = None  # storevirt.domain_summary
    domain_known: bool = False  # the hypervisor answered: `domain` None means no domain
    # Salt: the VM
    vm_key: str | None = None
    vm_answering: bool = False
    firstboot_stage: str | None = None
    # ERP
    erp_notices: list[dict[str, Any]] = Field(default_factory=list)
    erp_error: str | None = None
    # Prefect (reconcile only)
    last_run: LastRun | None = None

    @property
    def installed(self) -> bool:
        """Step 2 would skip the PXE install: key accepted and the ready grain set."""
        return self.hypervisor_key == "accepted" and self.hypervisor_ready

    @property
    def domain_uuid(self) -> str | None:
        return None if self.domain is None else str(self.domain.get("uuid"))

    def notice_for_vm(self) -> dict[str, Any] | None:
        """The ERP's notice for the VM that exists now (its uuid is in the idempotency key)."""
        uuid = self.domain_uuid
        return next((n for n in self.erp_notices if uuid and n.get("vm_uuid") == uuid), None)


class StepPlan(BaseModel):
    step: str
    todo: bool
    action: str
    details: list[str] = Field(default_factory=list)
    # False when the step's work happens in a later step (a cached image's transfer: step 5),
    # so a rerun is not said to resume here
    resumes_here: bool = True


def _short(key: str | None) -> str:
    return (key or "?")[:12]


def base_key_of(backing: str | None) -> str | None:
    """The image key of a VM disk's backing file (<images>/base/<key>/image.qcow2)."""
    match = _BASE_KEY.search(backing or "")
    return match.group("key") if match else None


def _image(f: StoreFacts) -> StepPlan:
    built = (f"cache hit {_short(f.image_key)}" if f.image_cached
             else f"build {_short(f.image_key)} ({f.image_builder} builder)")
    details = [f"image key {f.image_key}"]
    if f.domain_known and f.domain is not None:
        transfer = False
        details.append(f"transfer: no, domain {f.domain_name} exists and is reused")
    elif f.base_image_on_hypervisor:
        transfer = False
        details.append(f"transfer: no, {f.hypervisor} has the base image")
    else:
        transfer = True
        details.append(f"transfer: yes, {f.hypervisor} downloads it in step 5"
                       + ("" if f.hypervisor_answering else " (host not answering now)"))
    return StepPlan(step=STEP_IMAGE, todo=not f.image_cached or transfer,
                    action=built + ("; transfer to the hypervisor" if transfer else ""),
                    details=details, resumes_here=not f.image_cached)


def _pxe(f: StoreFacts) -> StepPlan:
    netboot = {True: "on", False: "off", None: "-"}[f.cobbler_netboot]
    if f.installed:
        details = [f"Cobbler system {f.cobbler_system}: "
                   + (f"exists, netboot {netboot}" if f.cobbler_record else "none")]
        if f.cobbler_netboot:
            details.append("netboot is on: a power cycle would reinstall this host")
        return StepPlan(step=STEP_PXE_INSTALL_HYPERVISOR, todo=False,
                        action="none: hypervisor installed and ready", details=details)
    if not f.cobbler_record:
        record = f"create Cobbler system {f.cobbler_system}"
    elif f.cobbler_changes:
        record = f"update Cobbler system {f.cobbler_system} ({len(f.cobbler_changes)} fields)"
    else:
        record = f"Cobbler system {f.cobbler_system} unchanged"
    details = [*f.cobbler_changes,
               f"netboot: on (now {netboot})" if f.cobbler_record else "netboot: on",
               f"sync system {f.cobbler_system}", "power cycle through Cobbler (PXE install)"]
    if f.hypervisor_key:
        details.append(f"delete hypervisor key {f.hypervisor} ({f.hypervisor_key})")
    details.append(f"issue a one-time autosign token for {f.hypervisor}")
    return StepPlan(step=STEP_PXE_INSTALL_HYPERVISOR, todo=True,
                    action=f"{record}; netboot on; sync; power cycle", details=details)


def _highstate_details(f: StoreFacts) -> list[str]:
    if f.highstate_changes is None:
        return [f"highstate test=True: {f.highstate_note or 'not checked'}"]
    if not f.highstate_changes:
        return ["highstate test=True: no changes"]
    return [f"highstate test=True: {len(f.highstate_changes)} states would change",
            *f.highstate_changes]


def _wait(f: StoreFacts) -> StepPlan:
    if f.installed:
        details = _highstate_details(f)
        if f.highstate_changes:
            details.append("a rollout does not reapply the highstate of a ready host")
        return StepPlan(step=STEP_WAIT_FOR_HYPERVISOR, todo=False,
                        action="none: hypervisor ready", details=details)
    if f.hypervisor_answering:
        return StepPlan(step=STEP_WAIT_FOR_HYPERVISOR, todo=True,
                        action="wait for the ready event (host up, not ready)",
                        details=_highstate_details(f))
    return StepPlan(step=STEP_WAIT_FOR_HYPERVISOR, todo=True,
                    action="wait for the install and the first highstate",
                    details=[f"{f.hypervisor} does not answer now"])


def _keys(f: StoreFacts) -> StepPlan:
    if f.domain is not None and f.vm_key == "accepted":
        return StepPlan(step=STEP_PREPARE_VM_KEYS, todo=False,
                        action=f"none: {f.domain_name} exists, key {f.vm} accepted")
    details = ([f"delete VM key {f.vm} ({f.vm_key})"] if f.vm_key else
               [f"no key of {f.vm} to delete"])
    details.append(f"issue a one-time autosign token for {f.vm} (accepted at its first contact)")
    return StepPlan(step=STEP_PREPARE_VM_KEYS, todo=True,
                    action="delete the stale VM key; issue a token" if f.vm_key
                    else "issue a one-time token", details=details)


def _create_vm(f: StoreFacts) -> StepPlan:
    if f.domain is None:
        details = [f"virt.init {f.domain_name} (start=False) on an overlay of image "
                   f"{_short(f.image_key)}", "write its identity seed", "virt.start"]
        if not f.domain_known:
            details.insert(0, f"{f.hypervisor} does not answer now: domain assumed missing")
        return StepPlan(step=STEP_CREATE_VM, todo=True, action=f"create {f.domain_name}",
                        details=details)
    details = [f"uuid {f.domain_uuid}, disk {f.domain.get('disk')}"]
    base = base_key_of(f.domain.get("backing"))
    if base and base != f.image_key:
        details.append(f"its disk is on image {_short(base)}, the current image is "
                       f"{_short(f.image_key)}: reused as is (roll the store back to move it)")
    todo, actions = False, []
    if (f.domain.get("seed") or {}).get("minion_id") != f.vm:
        todo = True
        actions.append("seed its identity")
    if f.domain.get("active"):
        actions.append("running")
    else:
        todo = True
        actions.append("start it (virt.start)")
    return StepPlan(step=STEP_CREATE_VM, todo=todo,
                    action=f"reuse {f.domain_name}: " + ", ".join(actions), details=details)


def _firstboot(f: StoreFacts) -> StepPlan:
    if f.vm_answering and f.firstboot_stage == FIRSTBOOT_STAGE_DONE:
        if f.domain is not None and (f.domain.get("seed") or {}).get("attached"):
            return StepPlan(step=STEP_FIRSTBOOT, todo=True,
                            action="firstboot done; retire the identity seed")
        return StepPlan(step=STEP_FIRSTBOOT, todo=False, action="none: firstboot done")
    if f.vm_answering:
        return StepPlan(step=STEP_FIRSTBOOT, todo=True,
                        action=f"continue firstboot from stage {f.firstboot_stage}")
    if f.domain is None:
        return StepPlan(step=STEP_FIRSTBOOT, todo=True,
                        action="firstboot: reboot, highstate, report, reboot and verify")
    return StepPlan(step=STEP_FIRSTBOOT, todo=True,
                    action=f"wait for {f.vm} to answer (it does not now)",
                    details=[f"its key: {f.vm_key or 'none'}"])


def _erp(f: StoreFacts) -> StepPlan:
    if f.erp_error:
        return StepPlan(step=STEP_NOTIFY_ERP, todo=True, action="notice (ERP not readable)",
                        details=[f.erp_error])
    notice = f.notice_for_vm()
    if notice is not None:
        return StepPlan(step=STEP_NOTIFY_ERP, todo=False,
                        action=f"none: replay keeps ERP id {notice['id']}")
    details = [f"ERP id {n['id']} is for an earlier VM (uuid {n.get('vm_uuid')})"
               for n in f.erp_notices]
    return StepPlan(step=STEP_NOTIFY_ERP, todo=True,
                    action="new notice" + (" for the new VM" if f.erp_notices else ""),
                    details=details)


def plan_store(f: StoreFacts) -> list[StepPlan]:
    """What a rollout of this store started now would do, step by step."""
    return [_image(f), _pxe(f), _wait(f), _keys(f), _create_vm(f), _firstboot(f), _erp(f)]


def first_todo(plan: list[StepPlan]) -> tuple[int, str] | None:
    """(1-based number, name) of the first step with something to do there (where a rerun
    resumes); None when none has."""
    return next(((STEPS.index(p.step) + 1, p.step) for p in plan if p.todo and p.resumes_here),
                None)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def plan_markdown(plans: dict[str, list[StepPlan]]) -> str:
    lines = ["# Rollout plan", ""]
    for store_id, plan in plans.items():
        todo = [p for p in plan if p.todo]
        lines += [f"## Store {store_id}: "
                  + (f"{len(todo)} of {len(plan)} steps to do" if todo else "nothing to do"), "",
                  "| step | to do | action | details |", "|---|---|---|---|"]
        for p in plan:
            details = "<br>".join(_cell(d) for d in p.details)
            lines.append(f"| {p.step} | {'yes' if p.todo else 'no'} | {_cell(p.action)} | "
                         f"{details} |")
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- reconcile

class Mismatch(BaseModel):
    code: str  # stable, for comparing reconciles
    what: str
    fix: str


class StoreStatus(BaseModel):
    store_id: str
    status: str  # ok, running, not-started, mismatch
    last_run: str  # "rollout-0042 Completed" or "none"
    real: str  # one line: what the systems say
    mismatches: list[Mismatch] = Field(default_factory=list)

    def fingerprint(self) -> str:
        """What a later reconcile compares to decide that the store's state changed."""
        return "/".join([self.status, *sorted(m.code for m in self.mismatches)])


def real_summary(f: StoreFacts) -> str:
    hv = ("ready" if f.installed else "answering" if f.hypervisor_answering
          else f"key {f.hypervisor_key}" if f.hypervisor_key else "not installed")
    if not f.domain_known:
        vm = "unknown (hypervisor not answering)" if f.hypervisor_key else "none"
    elif f.domain is None:
        vm = "no domain"
    else:
        vm = "running" if f.domain.get("active") else "stopped"
        vm += f", firstboot {f.firstboot_stage}" if f.vm_answering else ", minion silent"
    erp = ("notified" if f.notice_for_vm() else "error" if f.erp_error
           else "earlier VM notified" if f.erp_notices else "not notified")
    return f"hypervisor {hv}; VM {vm}; ERP {erp}"


def _complete(f: StoreFacts) -> bool:
    return (f.installed and f.domain is not None and bool(f.domain.get("active"))
            and f.vm_answering and f.firstboot_stage == FIRSTBOOT_STAGE_DONE
            and f.notice_for_vm() is not None)


def _resume(f: StoreFacts, plan: list[StepPlan]) -> str:
    first = first_todo(plan)
    rollout = f"`store-rollout rollout {f.store_id}`"
    if first is None:
        return f"{rollout} finds nothing to do and records the run Completed"
    return f"{rollout} resumes at step {first[0]} ({first[1]})"


def reconcile_store(f: StoreFacts, zombie_after: float) -> StoreStatus:
    """Name each disagreement between the systems and Prefect's last rollout run of the store,
    with the command that settles it. `zombie_after`: seconds without a heartbeat after which a
    Running run's process is taken for dead."""
    plan = plan_store(f)
    run = f.last_run
    mismatches: list[Mismatch] = []
    rollout = f"`store-rollout rollout {f.store_id}`"
    status = "ok"
    if run is None:
        anything = f.cobbler_record or f.hypervisor_key or f.domain is not None or f.erp_notices
        if not anything:
            status = "not-started"
        else:
            mismatches.append(Mismatch(
                code="no-run", what="the systems know this store but Prefect has no rollout run "
                f"of it ({real_summary(f)})", fix=f"{rollout} adopts what exists: "
                + _resume(f, plan).removeprefix(f"{rollout} ")))
    elif run.state in ("Running", "Pending", "Scheduled", "Paused", "Cancelling"):
        if run.state == "Running" and (run.heartbeat_age is None
                                        or run.heartbeat_age > zombie_after):
            age = ("no heartbeat seen" if run.heartbeat_age is None
                   else f"no heartbeat for {run.heartbeat_age:.0f} s")
            mismatches.append(Mismatch(
                code="zombie-run", what=f"run {run.name} is Running but {age}: no live "
                "process runs it", fix="the zombie automation marks it Crashed (`store-rollout "
                f"prefect-setup` installs it); then {_resume(f, plan)}"))
        else:
            status = "running"
    elif run.state == "Completed":
        if f.domain_known and f.domain is None:
            notice = f.erp_notices[-1]["id"] if f.erp_notices else None
            mismatches.append(Mismatch(
                code="domain-missing", what=f"domain {f.domain_name} is missing but the last "
                "rollout Completed" + (f" and the ERP was notified ({notice})" if notice else ""),
                fix=f"{rollout} recreates the VM ({_resume(f, plan).removeprefix(rollout + ' ')});"
                " the ERP gets a notice for the new VM's uuid"))
        elif f.domain is not None and not f.domain.get("active"):
            mismatches.append(Mismatch(
                code="vm-stopped", what=f"VM {f.domain_name} is stopped after its rollout",
                fix=f"{rollout} starts it (step 5) and waits for its minion (step 6)"))
        elif f.domain is not None and not f.vm_answering:
            mismatches.append(Mismatch(
                code="vm-silent", what=f"VM {f.domain_name} runs but its minion {f.vm} does "
                "not answer", fix=f"look at its console: `virsh console {f.domain_name}` on "
                f"{f.hypervisor}"))
        elif f.domain is not None and f.firstboot_stage != FIRSTBOOT_STAGE_DONE:
            mismatches.append(Mismatch(
                code="firstboot-not-done", what=f"VM {f.vm} is at firstboot stage "
                f"{f.firstboot_stage} after a Completed rollout", fix=_resume(f, plan)))
        elif f.domain is not None and f.notice_for_vm() is None and not f.erp_error:
            mismatches.append(Mismatch(
                code="erp-not-notified", what="VM running, firstboot done, ERP not notified of "
                "this VM", fix=_resume(f, plan)))
        if f.hypervisor_key == "accepted" and not f.hypervisor_answering:
            mismatches.append(Mismatch(
                code="hypervisor-silent", what=f"hypervisor {f.hypervisor} does not answer",
                fix=f"check the host (power, network): `salt {f.hypervisor} test.ping`"))
    else:  # Failed, Crashed, Cancelled
        if run.state == "Cancelled" and (f.domain is not None or f.vm_key):
            mismatches.append(Mismatch(
                code="cancelled-left-vm", what=f"run {run.name} was Cancelled but its VM "
                f"{'domain' if f.domain is not None else 'key'} remains",
                fix=f"`store-rollout rollback {f.store_id}`, or {_resume(f, plan)}"))
        elif run.state != "Cancelled" and _complete(f):
            mismatches.append(Mismatch(
                code="complete-run-not-completed", what=f"the systems show a complete rollout "
                f"but run {run.name} ended {run.state}", fix=_resume(f, plan)))
        elif run.state != "Cancelled":
            vm_done = (f.domain is not None and bool(f.domain.get("active")) and f.vm_answering
                       and f.firstboot_stage == FIRSTBOOT_STAGE_DONE)
            what = ("VM running, firstboot done, ERP not notified" if vm_done
                    else f"rollout ended {run.state}: {real_summary(f)}")
            mismatches.append(Mismatch(code="run-not-completed", what=what,
                                       fix=_resume(f, plan)))
    if f.cobbler_netboot and f.installed and run is not None and run.state == "Completed":
        mismatches.append(Mismatch(
            code="netboot-on", what=f"Cobbler netboot is on for the installed host "
            f"{f.cobbler_system}: its next power cycle reinstalls it",
            fix=f"`cobbler system edit --name {f.cobbler_system} --netboot-enabled false`"))
    if mismatches:
        status = "mismatch"
    return StoreStatus(store_id=f.store_id, status=status,
                       last_run=f"{run.name} {run.state}" if run else "none",
                       real=real_summary(f), mismatches=mismatches)


def reconcile_table(statuses: list[StoreStatus]) -> list[dict[str, str]]:
    """Rows of the reconcile table artifact (one per store)."""
    return [{"store": s.store_id, "status": s.status, "last run": s.last_run, "systems": s.real,
             "mismatch": "; ".join(m.what for m in s.mismatches),
             "fix": "; ".join(m.fix for m in s.mismatches), "fingerprint": s.fingerprint()}
            for s in statuses]
