"""The store VM's removal (rollback, a cancelled rollout's clean-up, decommission), through the
hypervisor's Salt minion: the domain and its system disk go; the store's data disk stays unless
the caller is a decommission that exported it first (store_rollout/data_disk.py)."""

from __future__ import annotations

import time
from typing import Any

from prefect import get_run_logger, task

from store_rollout import data_disk
from store_rollout.inventory import Store
from store_rollout.settings_parts import SaltSettings
from tasks.retry import SALT_VIRT_RETRY
from tasks.salt import SaltMinionNoResponse, SaltTransientError, master_client

# how long an installed host (its key accepted) gets to answer a cancel's clean-up: a busy host
# misses one 5-s ping, and silence is not absence (a clean-up that skipped it left the VM)
HOST_ANSWER_SECONDS = 60


def _answers_within(master: Any, minion: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not master.ping(minion, timeout=10):
        if time.monotonic() >= deadline:
            return False
        time.sleep(5)
    return True


@task(name="remove_vm", task_run_name="remove-vm-{store.store_id}",
      **SALT_VIRT_RETRY.on(SaltTransientError))
def remove_vm(store: Store, salt: SaltSettings, images_dir: str, host_may_be_gone: bool = False,
              keep_data: bool = True, silent_host_fails: bool = False) -> dict[str, Any]:
    """Destroy and undefine the store VM and delete its system disk (storevirt.remove_vm).
    Its data disk (<images_dir>/<vm>/data.raw) is kept unless `keep_data` is false: only a
    decommission, after its export. `host_may_be_gone` (a decommission, maybe rerun): a host
    without an accepted key or that does not answer (an earlier run powered it off) is not
    asked: its disks go with it. `silent_host_fails` (a cancel's clean-up): a host whose key
    is accepted and that does not answer within HOST_ANSWER_SECONDS fails the task (retried),
    never counts as gone. The result's `data_disk` says what became of the data disk."""
    logger = get_run_logger()
    master = master_client(salt.salt_master_config)
    hv = store.hypervisor_minion_id
    path = data_disk.data_disk_path(store, images_dir)
    accepted = not host_may_be_gone or master.key_state(hv) == "accepted"
    answering = not host_may_be_gone or (accepted and (
        _answers_within(master, hv, HOST_ANSWER_SECONDS) if silent_host_fails
        else master.ping(hv)))
    if accepted and not answering and silent_host_fails:
        raise SaltMinionNoResponse(hv, f"the removal of {store.vm_name} (the host is installed: "
                                   "its VM stays until it answers)", HOST_ANSWER_SECONDS)
    if not answering:
        logger.warning("store %s: %s has no accepted key or does not answer (an earlier "
                       "decommission run, or never installed): its VM and data disk, if any, "
                       "stay on its disk", store.store_id, hv)
        return {"name": store.vm_name, "host_gone": True,
                "data_disk": {"path": path, "kept": None}}
    removed = dict(master.cmd(hv, "storevirt.remove_vm", [store.vm_name],
                              kwarg={"keep_data": keep_data}))
    # the host's word: the data disk it kept (None: there was none)
    kept = removed.get("data_kept") if keep_data else None
    said = (data_disk.kept(hv, kept) if kept else f"{store.vm_name} had no data disk on {hv}"
            ) if keep_data else f"the store's data disk {path} on {hv} is removed"
    logger.warning("store %s: VM %s removed (%s); %s", store.store_id, store.vm_name, removed,
                   said)
    return {**removed, "data_disk": {"path": kept if keep_data else path,
                                     "kept": bool(kept), "said": said}}
