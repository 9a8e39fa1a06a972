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
from tasks.salt import SaltTransientError, master_client

# how long an installed host (its key accepted) gets to answer a cancel's clean-up: a busy host
# misses one 5-s ping, and silence is not absence (a clean-up that skipped it left the VM)
HOST_ANSWER_SECONDS = 60


class VmLeftOnSilentHost(RuntimeError):
    """A cancel's clean-up found the store's installed host silent: its VM is still there."""

    def __init__(self, store_id: str, host: str, vm_name: str) -> None:
        super().__init__(f"store {store_id}: the installed host {host} did not answer within "
                         f"{HOST_ANSWER_SECONDS} s; VM {vm_name} stays on it (its key removed, "
                         "netboot off). Once the host answers, run `store-rollout rollback "
                         f"{store_id}` to remove it")


def _answers_within(master: Any, minion: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not master.ping(minion, timeout=10):
        if time.monotonic() >= deadline:
            return False
        time.sleep(5)
    return True


def _host_reach(master: Any, hv: str, host_may_be_gone: bool, silent_host_fails: bool) -> str:
    """"answering"; "gone" (a decommission's host: no accepted key, or no answer to a ping);
    "silent" (a cancel's clean-up: its key accepted, no answer within HOST_ANSWER_SECONDS)."""
    if not host_may_be_gone:  # a rollback: the host is there, a failure to reach it is an error
        return "answering"
    if master.key_state(hv) != "accepted":
        return "gone"
    if silent_host_fails:
        return "answering" if _answers_within(master, hv, HOST_ANSWER_SECONDS) else "silent"
    return "answering" if master.ping(hv) else "gone"


@task(name="remove_vm", task_run_name="remove-vm-{store.store_id}",
      **SALT_VIRT_RETRY.on(SaltTransientError))
def remove_vm(store: Store, salt: SaltSettings, images_dir: str, host_may_be_gone: bool = False,
              keep_data: bool = True, silent_host_fails: bool = False) -> dict[str, Any]:
    """Destroy and undefine the store VM and delete its system disk (storevirt.remove_vm).
    Its data disk (<images_dir>/<vm>/data.raw) is kept unless `keep_data` is false: only a
    decommission, after its export. `host_may_be_gone` (a decommission, maybe rerun): a host
    without an accepted key or that does not answer (an earlier run powered it off) is not
    asked: its disks go with it. `silent_host_fails` (a cancel's clean-up): a host whose key
    is accepted and that does not answer within HOST_ANSWER_SECONDS never counts as gone: the
    result names it (`host_silent`) and the caller fails once its other steps are done. The
    result's `data_disk` says what became of the data disk."""
    logger = get_run_logger()
    master = master_client(salt.salt_master_config)
    hv = store.hypervisor_minion_id
    path = data_disk.data_disk_path(store, images_dir)
    reach = _host_reach(master, hv, host_may_be_gone, silent_host_fails)
    if reach == "silent":
        logger.warning("store %s: %s is installed and did not answer within %.0f s: VM %s stays "
                       "on it until a rollback finds it answering", store.store_id, hv,
                       HOST_ANSWER_SECONDS, store.vm_name)
        return {"name": store.vm_name, "host_silent": hv,
                "data_disk": {"path": path, "kept": None}}
    if reach == "gone":
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
