"""`store-rollout prefect-setup`: the Prefect server made ready for rollouts, region by region
(idempotent; run once per server and again after a region is added; `lab up` runs it)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from app.runner import console, refuse, refuse_settings

REPO_ROOT = Path(__file__).resolve().parent.parent


def setup_regions(regions_file: str, source: Path = REPO_ROOT) -> list[str]:
    """Each region's Cobbler sync limit; for each region but `default` (prefect.yaml's), its
    work pool and its copies of the regional deployments, run from the checkout at `source`
    (the worker hosts' checkouts must sit at the same path). What was done, one line each."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.workers.process import ProcessWorker

    from app.deployments import deploy_from_source, regional_specs
    from store_rollout.regions import DEFAULT_COBBLER_SYNC_LIMIT, DEFAULT_REGION, load_regions
    from tasks.slots import set_limit

    regions = load_regions(regions_file)
    done = []
    for limit in sorted({spec.settings.get("cobbler_sync_limit", DEFAULT_COBBLER_SYNC_LIMIT)
                         for spec in regions.regions.values()}):
        set_limit(limit, 1)
        done.append(f"global concurrency limit {limit}: 1 slot, active")
    for region, spec in regions.regions.items():
        if region == DEFAULT_REGION:
            continue
        with get_client(sync_client=True) as client, contextlib.suppress(ObjectAlreadyExists):
            # as `prefect work-pool create --type process` makes it
            client.create_work_pool(WorkPoolCreate(
                name=spec.work_pool, type="process",
                base_job_template=ProcessWorker.get_default_base_job_template()))
        names = [f"{d.name}-{region}" for d in regional_specs()]
        for deployment in regional_specs():
            deploy_from_source(deployment, source=str(source), name=f"{deployment.name}-{region}",
                               work_pool=spec.work_pool)
        done.append(f"region {region}: work pool {spec.work_pool!r}, deployments "
                    f"{', '.join(names)} (workers: `STORE_ROLLOUT_REGION={region} prefect worker "
                    f"start --pool {spec.work_pool}`)")
    return done


def prefect_setup() -> None:
    """Make the Prefect server ready for rollouts (idempotent): each region's `cobbler-sync`
    limit, work pool and deployments, and the automation that marks dead flow runs Crashed.
    Run it once per server, and after a region is added (lab up does)."""
    from store_rollout.regions import RegionsError, load_regions
    from store_rollout.settings import SettingsError
    from store_rollout.settings_outside import one_setting
    from tasks.notifications import ensure_notifications
    from tasks.run_health import AUTOMATION_NAME, ensure_zombie_automation, zombie_after

    try:  # all read before the server is changed
        beat, notify_through, ready_within, regions_file = (one_setting(name) for name in (
            "heartbeat_seconds", "notification_block", "hypervisor_ready_expected_seconds",
            "regions_file"))
        load_regions(regions_file)
    except SettingsError as exc:
        refuse_settings(exc)
    except RegionsError as exc:
        refuse(str(exc))
    for line in setup_regions(regions_file):
        console.print(line)
    console.print(f"automation {AUTOMATION_NAME!r}: {ensure_zombie_automation(beat)} (a flow run "
                  f"without a heartbeat for {zombie_after(beat):.0f} s is marked Crashed; the "
                  f"workers' STORE_ROLLOUT_HEARTBEAT_SECONDS must be {beat:g} too)")
    if notify_through:
        for name, done in ensure_notifications(notify_through, ready_within).items():
            console.print(f"automation {name!r}: {done} (messages through {notify_through!r})")
    else:
        console.print("no notification block set (STORE_ROLLOUT_NOTIFICATION_BLOCK): failures "
                      "and waits are seen in the UI only")
    console.print("keep the server's concurrency leases across restarts (docs/reliability.md)")
