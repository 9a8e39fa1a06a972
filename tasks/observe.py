"""Read the real systems for `plan`, `reconcile` and a rollout's approval, changing nothing:
Cobbler (records), the Salt master (keys; hypervisor and VM grains; the hypervisor's highstate
in test=True), each hypervisor's libvirt (through `storevirt.inspect`), the image cache, the ERP
(its notices) and Prefect (each store's last rollout run and its heartbeats).

One batched call per kind for all the stores asked about (one Salt job per function over a
list target, one key listing, one Prefect query), so 25 stores cost about what one does.
The facts go to store_rollout/fleet/, which draws the conclusions (`plan_for_approval`: one
store's plan, which the rollout flow hands its approval).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import get_run_logger, task

from store_rollout import step_rules
from store_rollout.contracts import (
    FIRSTBOOT_STAGE_GRAIN,
    FIRSTBOOT_STAGE_NEW,
    HARDWARE_SERIAL_GRAIN,
    HYPERVISOR_READY_GRAIN,
    IMAGE_VERSION_GRAIN,
)
from store_rollout.fleet.backups import with_restore
from store_rollout.fleet.facts import LastRun, StoreFacts, base_key_of
from store_rollout.fleet.plan import StepPlan, plan_store
from store_rollout.inventory import Store
from store_rollout.platforms import HOST_OS_GRAINS, host_platform
from store_rollout.settings import RolloutSettings
from store_rollout.settings_backup import BackupPart
from store_rollout.settings_parts import BmcSettings, CobblerSettings, ErpSettings, HostSettings, SaltSettings
from store_rollout.step_timeouts import STEP_TIMEOUTS
from tasks.backup import read_backups
from tasks.bmc import BmcError, bmc_client
from tasks.cobbler import power_cycled_at
from tasks.flow_runs import newest_rollout_runs
from tasks.image_targets import target_images, version_of_key
from tasks.outside_reads import read_outside
from tasks.run_health import HEARTBEAT_EVENT
from tasks.salt import SaltCommandFailed, SaltMasterClient, key_state_in, master_client

READ_TIMEOUT = 3  # seconds a minion gets to answer a read (a silent one is reported as such)
# and on top, per minion read: the master's request workers store about 100 returns a second
# (bench_region_scale: 2,000 pings in 17 s on 2 shared cores), and Salt gives the publication
# itself only the job's timeout; 3 s alone refused a read of a 1,000-store region outright
READ_SECONDS_PER_MINION = 0.01
HIGHSTATE_TEST_TIMEOUT = 60
# test=True reports an event state as "would fire" on every run: an announcement, not drift
_NOT_DRIFT = ("event_|-",)


def highstate_changes(ret: Any) -> list[str]:
    """States of a test=True highstate return that would change something, in run order."""
    if not isinstance(ret, dict):
        return [str(ret)[:300]]
    found = [(v.get("__run_num__", 0), k, v) for k, v in ret.items() if isinstance(v, dict)
             and not k.startswith(_NOT_DRIFT) and (v.get("result") is None or v.get("changes"))]
    return [f"{v.get('__id__', key)}: {str(v.get('comment', '')).strip()[:200]}"
            for _, key, v in sorted(found, key=lambda t: t[0])]


def _answers(master: SaltMasterClient, minions: list[str], fun: str, arg: list[Any],
             timeout: float = READ_TIMEOUT,
             kwarg: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """({minion: ret} of those that answered, {minion: error} of those whose call failed)."""
    ok: dict[str, Any] = {}
    failed: dict[str, str] = {}
    allowed = timeout + READ_SECONDS_PER_MINION * len(minions)
    for minion, ret in master.cmd_many(minions, fun, arg, kwarg=kwarg, timeout=allowed).items():
        if isinstance(ret, SaltCommandFailed):
            failed[minion] = ret.detail
        else:
            ok[minion] = ret
    return ok, failed


def _inspect(master: SaltMasterClient, wanted: dict[str, dict[str, list[str]]]
             ) -> tuple[dict[str, Any], dict[str, str]]:
    """storevirt.inspect of the hypervisors of `wanted` ({hv: {"domains": [names],
    "base_images": [keys]}}): one job naming only the image keys (each host reports all its
    domains), then, for a host whose module predates that form (it failed on the keyword, or
    has no "every_domain" in its answer), the old form with its own entry."""
    keys = sorted({key for entry in wanted.values() for key in entry["base_images"]})
    inspected, failed = _answers(master, list(wanted), "storevirt.inspect", [], timeout=15,
                                 kwarg={"base_images": keys})
    older = set(failed) | {hv for hv, ret in inspected.items()
                           if not (ret or {}).get("every_domain")}
    if older:
        again, failed_again = _answers(master, sorted(older), "storevirt.inspect",
                                       [{hv: wanted[hv] for hv in older}], timeout=15)
        inspected.update(again)
        failed = {hv: error for hv, error in {**failed, **failed_again}.items()
                  if hv not in again}
    return inspected, failed


def observe(stores: list[Store], settings: RolloutSettings, *, highstate_test: bool = False,
            last_runs: bool = False,
            install_seconds: float = STEP_TIMEOUTS.hypervisor_timeout,
            image_version: str = "") -> dict[str, StoreFacts]:
    """The facts of each store, keyed by store id. `highstate_test`: also run each answering
    hypervisor's highstate in test=True (plan); `last_runs`: also read Prefect (reconcile);
    `install_seconds`: the hypervisor_timeout of the rollout planned (its step 2 leaves an
    install that young alone); `image_version`: the version every store is to run (an
    upcoming update; default each store's own)."""
    master = master_client(settings.salt_master_config)
    images = target_images(stores, settings, settings.image_cache_dir, settings.image_builder,
                           image_version)
    keys = master.list_keys()
    hv_keys = {s.store_id: key_state_in(keys, s.hypervisor_minion_id) for s in stores}
    vm_keys = {s.store_id: key_state_in(keys, s.vm_minion_id) for s in stores}

    hypervisors = [s.hypervisor_minion_id for s in stores if hv_keys[s.store_id] == "accepted"]
    vms = [s.vm_minion_id for s in stores if vm_keys[s.store_id] == "accepted"]
    # one job reads both minions' grains of every store
    grains, _ = _answers(master, hypervisors + vms, "grains.item",
                         [HYPERVISOR_READY_GRAIN, FIRSTBOOT_STAGE_GRAIN, HARDWARE_SERIAL_GRAIN,
                          IMAGE_VERSION_GRAIN, *HOST_OS_GRAINS])
    ready = {hv: (grains[hv] or {}).get(HYPERVISOR_READY_GRAIN) for hv in hypervisors
             if hv in grains}
    stages = {vm: (grains[vm] or {}).get(FIRSTBOOT_STAGE_GRAIN) for vm in vms if vm in grains}
    answering = [hv for hv in hypervisors if hv in ready]
    inspected, inspect_failed = _inspect(master, {
        s.hypervisor_minion_id: {"domains": [s.vm_name],
                                 "base_images": [images[s.store_id]["key"]]}
        for s in stores if s.hypervisor_minion_id in ready})
    tested: dict[str, Any] = {}
    test_failed: dict[str, str] = {}
    if highstate_test and answering:
        tested, test_failed = _highstate_test(master, answering)

    # cut once for every store below
    salt, hosts, power = (SaltSettings.of(settings), HostSettings.of(settings),
                          BmcSettings.of(settings))
    outside = read_outside(stores, CobblerSettings.of(settings), ErpSettings.of(settings), salt,
                           hosts)
    runs = last_rollout_runs([s.store_id for s in stores]) if last_runs else {}
    backups = read_backups([s.vm_minion_id for s in stores], BackupPart.of(settings))
    facts: dict[str, StoreFacts] = {}
    for store in stores:
        sid, hv, vm = store.store_id, store.hypervisor_minion_id, store.vm_minion_id
        record, changes = outside[sid].record, outside[sid].changes
        notices, erp_error = outside[sid].notices, outside[sid].erp_error
        found = inspected.get(hv) or {}
        domain = (found.get("domains") or {}).get(store.vm_name)
        image = images[sid]
        note = None
        if hv in inspect_failed:
            note = f"storevirt.inspect failed on {hv}: {inspect_failed[hv]}"
        elif not highstate_test:
            note = "not run"
        elif hv in test_failed:
            note = test_failed[hv]
        elif hv not in tested:
            note = f"{hv} does not answer"
        facts[sid] = StoreFacts(
            store_id=sid, platform=host_platform(store, hosts).name,
            host_os=host_os(grains.get(hv)), hypervisor=hv, vm=vm, domain_name=store.vm_name,
            cobbler_system=store.cobbler_system, image_key=image["key"],
            image_cached=image["cached"], image_builder=image["builder"],
            image_version=image["version"],
            vm_image_version=str((grains.get(vm) or {}).get(IMAGE_VERSION_GRAIN) or "") or None,
            disk_image_version=_disk_version(settings.image_cache_dir, domain),
            cobbler_record=record is not None,
            cobbler_netboot=None if record is None else bool(record.get("netboot_enabled")),
            cobbler_changes=changes, power_cycled_at=power_cycled_at(record),
            host_powered_on=_host_on(store, power, record, hv_keys[sid],
                                     ready.get(hv), install_seconds),
            install_seconds=install_seconds,
            hypervisor_key=hv_keys[sid], hypervisor_answering=hv in ready,
            hypervisor_ready=bool(ready.get(hv)), expected_serial=store.hypervisor.serial,
            hypervisor_serial=str((grains.get(hv) or {}).get(HARDWARE_SERIAL_GRAIN) or "") or None,
            highstate_changes=tested.get(hv), highstate_note=note,
            base_image_on_hypervisor=(found.get("base_images") or {}).get(image["key"])
            if hv in inspected else None,
            domain=domain, domain_known=hv in inspected,
            vm_key=vm_keys[sid], vm_answering=vm in stages,
            firstboot_stage=str(stages[vm] or FIRSTBOOT_STAGE_NEW) if vm in stages else None,
            erp_notices=notices, erp_error=erp_error, last_run=runs.get(sid), **backups[vm])
    return facts


def _disk_version(cache_dir: str, domain: dict[str, Any] | None) -> str | None:
    """The version of the base image the domain's system disk is on (the host names its key)."""
    if domain is None:
        return None
    key = str(domain.get("image_key") or "") or base_key_of(domain.get("backing"))
    return version_of_key(cache_dir, key)


def host_os(grains: dict[str, Any] | None) -> str | None:
    """The OS a host reports, "<osfullname> <osrelease>" ("SLES 15.7", "Leap 15.6"); None when
    it does not answer. A grain any minion can write: it only ever flags, never decides."""
    if not grains or not grains.get("osfullname"):
        return None
    return " ".join(str(grains.get(g) or "") for g in HOST_OS_GRAINS).strip()


def _host_on(store: Store, settings: BmcSettings, record: dict[str, Any] | None,
             key: str | None, ready: Any, install_seconds: float) -> bool | None:
    """The host's power, from its BMC, asked only when it decides step 2: the host is not
    installed and ready, and an earlier run powered it on into an install less than
    `install_seconds` ago."""
    recorded = step_rules.install_recorded(record is not None, None if record is None
                                           else bool(record.get("netboot_enabled")))
    if step_rules.hypervisor_installed(key, recorded, bool(ready)) or not step_rules.install_underway(
            power_cycled_at(record), datetime.now(UTC), install_seconds, True):
        return None
    try:
        return bmc_client(store, settings).power_state() == "on"
    except (BmcError, ValueError):
        return None  # unknown: the plan says step 2 would power-cycle


def _highstate_test(master: SaltMasterClient,
                    minions: list[str]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Each hypervisor's highstate in test=True (one job): the states that would change.
    test=True reports would-be changes with retcode 0; a failure is a real error (a state run
    in progress, a render error)."""
    answered, failed = _answers(master, minions, "state.highstate", [],
                                timeout=HIGHSTATE_TEST_TIMEOUT, kwarg={"test": True})
    failed = {m: f"highstate test=True failed: {detail[:300]}" for m, detail in failed.items()}
    failed.update({m: "highstate test=True: no answer" for m in minions
                   if m not in answered and m not in failed})
    return {m: highstate_changes(ret) for m, ret in answered.items()}, failed


def last_rollout_runs(store_ids: list[str]) -> dict[str, LastRun]:
    """Each store's newest store-rollout run (one query), with its last heartbeat's age when
    it is Running."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import (
        EventFilter,
        EventNameFilter,
        EventOccurredFilter,
        EventResourceFilter,
    )

    with get_client(sync_client=True) as client:
        newest = newest_rollout_runs(client, store_ids)
        running = [r for r in newest.values() if r.state and r.state.name == "Running"]
        beats: dict[str, datetime] = {}
        if running:
            now = datetime.now(UTC)
            page = client.read_events(filter=EventFilter(
                occurred=EventOccurredFilter.model_validate(
                    {"since": now - timedelta(hours=6), "until": now + timedelta(minutes=1)}),
                event=EventNameFilter(name=[HEARTBEAT_EVENT]),
                resource=EventResourceFilter(id=[f"prefect.flow-run.{r.id}" for r in running])),
                limit=50 * len(running))
            for event in page.events:
                rid = event.resource.id.removeprefix("prefect.flow-run.")
                beats[rid] = max(beats.get(rid, event.occurred), event.occurred)
    now = datetime.now(UTC)
    return {sid: LastRun(
        id=str(run.id), name=run.name, state=run.state.name if run.state else "?",
        started=run.start_time.isoformat(timespec="seconds") if run.start_time else None,
        heartbeat_age=(now - beats[str(run.id)]).total_seconds()
        if str(run.id) in beats else None) for sid, run in newest.items()}


@task(name="observe_stores", task_run_name="observe-stores")
def observe_stores(stores: list[Store], settings: RolloutSettings, highstate_test: bool = False,
                   last_runs: bool = False,
                   install_seconds: float = STEP_TIMEOUTS.hypervisor_timeout,
                   image_version: str = "") -> dict[str, StoreFacts]:
    """The read-only step of plan and reconcile: every store's facts, one call per kind (it
    reads every outside system: it takes all the settings)."""
    facts = observe(stores, settings, highstate_test=highstate_test, last_runs=last_runs,
                    install_seconds=install_seconds, image_version=image_version)
    get_run_logger().info("observed %d stores", len(facts))
    return facts


@task(name="plan_for_approval", task_run_name="plan-for-approval-{store.store_id}")
def plan_for_approval(store: Store, recreate_vm: bool, reinstall_hypervisor: bool = False,
                      replace_box: bool = False, *, settings: RolloutSettings,
                      install_seconds: float = STEP_TIMEOUTS.hypervisor_timeout
                      ) -> list[StepPlan]:
    """The store's plan as `store-rollout plan` makes it (its highstate not tested): what an
    approval shows and decides on (the rollout flow hands it to tasks/approvals.py), for the
    run asking: `install_seconds` its hypervisor_timeout, as its step 2 takes it."""
    facts = observe([store], settings, install_seconds=install_seconds)[store.store_id]
    return with_restore(plan_store(facts, recreate_vm=recreate_vm,
                                   reinstall_hypervisor=reinstall_hypervisor,
                                   replace_box=replace_box), facts, replace_box)
