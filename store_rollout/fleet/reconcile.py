"""Each disagreement between the real systems and Prefect's last rollout run of a store, with
the command that settles it (`store-rollout reconcile`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from store_rollout import step_rules
from store_rollout.fleet.backups import backup_line, backup_mismatches
from store_rollout.fleet.facts import StoreFacts
from store_rollout.fleet.plan import StepPlan, first_todo, plan_store
from store_rollout.fleet.versions import StoreVersions, store_versions, version_mismatches
from store_rollout.platforms import retired_since


class Mismatch(BaseModel):
    code: str  # stable, for comparing reconciles
    what: str
    fix: str


class StoreStatus(BaseModel):
    store_id: str
    platform: str = ""  # the inventory's (store_rollout/platforms.py)
    status: str  # ok, running, not-started, mismatch
    last_run: str  # "rollout-0042 Completed" or "none"
    real: str  # one line: what the systems say
    mismatches: list[Mismatch] = Field(default_factory=list)
    # the image version its VM runs (its grain), its disk's and the one expected (issue 47)
    versions: StoreVersions | None = None
    last_backup: str = ""  # its newest backup, one line (store_rollout/fleet/backups.py)
    # the fleet view's times (store_rollout/fleet/view.py), ISO 8601: the last run's start
    # and the newest backup's (None: none, or not known)
    last_run_started: str | None = None
    last_backup_time: str | None = None

    def fingerprint(self) -> str:
        """What a later reconcile compares to decide that the store's state changed."""
        return "/".join([self.status, *sorted(m.code for m in self.mismatches)])


def real_summary(f: StoreFacts) -> str:
    hv = ("ready" if f.installed and f.hypervisor_ready else "silent" if f.silent
          else "answering" if f.hypervisor_answering
          else f"key {f.hypervisor_key}" if f.hypervisor_key else "not installed")
    if not f.domain_known:
        vm = "unknown (hypervisor not answering)" if f.hypervisor_key else "none"
    elif f.domain is None:
        vm = "no domain"
    else:
        vm = "running" if f.running else "stopped"
        vm += f", firstboot {f.firstboot_stage}" if f.vm_answering else ", minion silent"
    erp = ("notified" if f.notice_for_vm() else "error" if f.erp_error
           else "earlier VM notified" if f.erp_notices else "not notified")
    host = f" ({f.host_os})" if f.host_os else ""
    return f"hypervisor {hv}{host}; VM {vm}; ERP {erp}"


def _complete(f: StoreFacts) -> bool:
    return (f.installed and f.hypervisor_ready and f.running and f.firstboot_done
            and f.notice_for_vm() is not None)


def _resume(f: StoreFacts, plan: list[StepPlan]) -> str:
    first = first_todo(plan)
    rollout = f"`store-rollout rollout {f.store_id}`"
    if first is None:
        return f"{rollout} finds nothing to do and records the run Completed"
    return f"{rollout} resumes at step {first[0]} ({first[1]})"


def _after_completed(f: StoreFacts, plan: list[StepPlan]) -> list[Mismatch]:
    """What contradicts a Completed last run."""
    rollout = f"`store-rollout rollout {f.store_id}`"
    mismatches: list[Mismatch] = []
    if f.domain_known and f.domain is None:
        notice = f.erp_notices[-1]["id"] if f.erp_notices else None
        mismatches.append(Mismatch(
            code="domain-missing", what=f"domain {f.domain_name} is missing but the last "
            "rollout Completed" + (f" and the ERP was notified ({notice})" if notice else ""),
            fix=f"{rollout} recreates the VM ({_resume(f, plan).removeprefix(rollout + ' ')});"
            " the ERP gets a notice for the new VM's uuid"))
    elif f.domain is not None and not f.running:
        mismatches.append(Mismatch(
            code="vm-stopped", what=f"VM {f.domain_name} is stopped after its rollout",
            fix=f"{rollout} starts it (step 5) and waits for its minion (step 6)"))
    elif f.domain is not None and not f.vm_answering:
        mismatches.append(Mismatch(
            code="vm-silent", what=f"VM {f.domain_name} runs but its minion {f.vm} does "
            "not answer", fix=f"look at its console: `virsh console {f.domain_name}` on "
            f"{f.hypervisor}"))
    elif f.domain is not None and not f.firstboot_done:
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
    return mismatches


def _after_ended(f: StoreFacts, plan: list[StepPlan], name: str, state: str) -> list[Mismatch]:
    """What a Failed, Crashed or Cancelled last run left."""
    if state == "Cancelled":
        # a cancel leaves a live store as it is (its cancelled run cleaned nothing of it)
        if (f.domain is None and not f.vm_key) or step_rules.store_live(f.erp_notices):
            return []
        return [Mismatch(
            code="cancelled-left-vm", what=f"run {name} was Cancelled but its VM "
            f"{'domain' if f.domain is not None else 'key'} remains",
            fix=f"`store-rollout rollback {f.store_id}`, or {_resume(f, plan)}")]
    if _complete(f):
        return [Mismatch(
            code="complete-run-not-completed", what=f"the systems show a complete rollout "
            f"but run {name} ended {state}", fix=_resume(f, plan))]
    vm_done = f.running and f.firstboot_done
    what = ("VM running, firstboot done, ERP not notified" if vm_done
            else f"rollout ended {state}: {real_summary(f)}")
    return [Mismatch(code="run-not-completed", what=what, fix=_resume(f, plan))]


def _platform_retired(f: StoreFacts) -> list[Mismatch]:
    """A host still on an OS out of support (its grains say so: a flag, never an action)."""
    since = retired_since(f.host_os)
    if since is None:
        return []
    return [Mismatch(
        code="platform-out-of-support", what=f"hypervisor {f.hypervisor} runs {f.host_os}, "
        f"out of support since {since.isoformat()}: platform out of support",
        fix=f"reinstall it on {f.platform or 'a supported platform'} in a maintenance window, "
        f"approved: `store-rollout plan {f.store_id} --reinstall-hypervisor`, then "
        f"`store-rollout rollout {f.store_id} --reinstall-hypervisor`")]


def _decommissioned(f: StoreFacts) -> StoreStatus:
    """A closed store: nothing of it may be left anywhere."""
    left = f.leftovers()
    mismatches = [Mismatch(
        code="decommission-incomplete", what=f"the ERP has the store's decommission, but "
        f"{', '.join(left)} still exist", fix=f"`store-rollout decommission {f.store_id}` "
        "removes what is left")] if left else []
    return StoreStatus(store_id=f.store_id, platform=f.platform,
                       status="mismatch" if left else "decommissioned",
                       last_run=f"{f.last_run.name} {f.last_run.state}" if f.last_run else "none",
                       real="decommissioned" + (f"; left: {', '.join(left)}" if left else ""),
                       mismatches=mismatches,
                       last_run_started=f.last_run.started if f.last_run else None)


def reconcile_store(f: StoreFacts, zombie_after: float) -> StoreStatus:
    """Name each disagreement between the systems and Prefect's last rollout run of the store,
    with the command that settles it. `zombie_after`: seconds without a heartbeat after which a
    Running run's process is taken for dead."""
    if f.decommissioned:
        return _decommissioned(f)
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
        mismatches += _after_completed(f, plan)
    else:  # Failed, Crashed, Cancelled
        mismatches += _after_ended(f, plan, run.name, run.state)
    if f.cobbler_netboot and f.installed and run is not None and run.state == "Completed":
        mismatches.append(Mismatch(
            code="netboot-on", what=f"Cobbler netboot is on for the installed host "
            f"{f.cobbler_system}: its next power cycle reinstalls it",
            fix=f"`cobbler system edit --name {f.cobbler_system} --netboot-enabled false`"))
    if f.wrong_hardware:
        mismatches.append(Mismatch(
            code="wrong-hardware", what=f"hypervisor {f.hypervisor} reports serial "
            f"{f.hypervisor_serial!r}, the inventory's hypervisor.serial is {f.expected_serial!r}",
            fix="correct hypervisor.serial in the inventory if the box is the store's; else "
            "rack the store's own box and roll out again with its MAC"))
    mismatches += _platform_retired(f)
    if status != "running":  # a rollout under way changes the version itself
        mismatches += [Mismatch(code=code, what=what, fix=fix)
                       for code, what, fix in version_mismatches(f)]
    mismatches += [Mismatch(code=code, what=what, fix=fix)
                   for code, what, fix in backup_mismatches(f)]
    if mismatches:
        status = "mismatch"
    return StoreStatus(store_id=f.store_id, platform=f.platform, status=status,
                       last_run=f"{run.name} {run.state}" if run else "none",
                       real=real_summary(f), mismatches=mismatches, versions=store_versions(f),
                       last_backup=backup_line(f), last_run_started=run.started if run else None,
                       last_backup_time=(f.last_backup or {}).get("time"))
