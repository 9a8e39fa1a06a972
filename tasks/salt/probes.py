"""One question to a minion, or one action on it, that the steps and their waits share.

Typed against `MasterApi`, the part of `SaltMasterClient` they use, so a watcher's unit test
passes a fake master.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from store_rollout.contracts import (
    FIRSTBOOT_STAGE_GRAIN,
    FIRSTBOOT_STAGE_NEW,
    HARDWARE_SERIAL_GRAIN,
    HYPERVISOR_EXTENSION_FORMS,
    HYPERVISOR_READY_GRAIN,
)
from tasks.salt.errors import HypervisorKeyContested, MinionKeyContested, SaltError
from tasks.salt.events import EventBus
from tasks.salt.extensions import SALTENV
from tasks.salt.masterlog import MasterLogTail

# a probe asks whether a minion answers at all: after its 5 s, the master's own 10-s follow-up
# (find_job) to a minion that is down only made every probe of a down VM cost 15 s
PROBE_TIMEOUT, PROBE_GATHER_TIMEOUT = 5.0, 2.0


class MasterApi(Protocol):
    """What the waits of steps 3 and 6 use of `SaltMasterClient`."""

    master_config: str

    def subscribe(self, prefix: str = "") -> AbstractContextManager[EventBus]: ...

    def cmd(self, minion_id: str, fun: str, arg: list[Any] | tuple[Any, ...] = (),
            kwarg: dict[str, Any] | None = None, timeout: float = 60,
            gather_job_timeout: float | None = None) -> Any: ...

    def cmd_async(self, minion_id: str, fun: str,
                  arg: list[Any] | tuple[Any, ...] = ()) -> str: ...

    def job_return(self, jid: str, minion_id: str, wait: float = 5) -> dict[str, Any] | None: ...

    def key_state(self, minion_id: str) -> str | None: ...

    def list_keys(self) -> dict[str, list[str]]: ...

    def delete_key(self, minion_id: str) -> bool: ...

    def fingerprints(self, minion_id: str) -> dict[str, list[str]]: ...

    def revoke_token(self, minion_id: str) -> bool: ...

    def log_tail(self) -> MasterLogTail: ...

    def cmd_multi(self, minion_id: str, calls: list[tuple[str, list[Any]]],
                  timeout: float = 60) -> dict[str, Any]: ...

    def extension_hashes(self) -> tuple[str, dict[str, str]]: ...


def hypervisor_state(master: MasterApi, minion_id: str) -> str:
    """Current state, not events: 'ready' (its highstate set the ready grain), 'answering'
    (up, not ready yet) or 'silent' (not installed, booting, or its key not accepted)."""
    try:
        ready = master.cmd(minion_id, "grains.get", [HYPERVISOR_READY_GRAIN],
                           timeout=PROBE_TIMEOUT, gather_job_timeout=PROBE_GATHER_TIMEOUT)
    except SaltError:
        return "silent"
    return "ready" if ready else "answering"


def hypervisor_ready(master: MasterApi, minion_id: str) -> bool:
    return hypervisor_state(master, minion_id) == "ready"


def hardware_serial(master: MasterApi, minion_id: str) -> str | None:
    """The machine's SMBIOS serial as its minion's core grain reports it (None: it has none);
    a minion that does not answer raises SaltMinionNoResponse (transient)."""
    serial = master.cmd(minion_id, "grains.get", [HARDWARE_SERIAL_GRAIN], timeout=PROBE_TIMEOUT,
                        gather_job_timeout=PROBE_GATHER_TIMEOUT)
    return str(serial).strip() or None if serial else None


def reapply_highstate(master: MasterApi, minion_id: str) -> str | None:
    """Start the highstate of a hypervisor that is up but never got ready (its startup run was
    lost); None when a state run is still going, so two never overlap. Returns the job id."""
    running = master.cmd(minion_id, "saltutil.running", timeout=10) or []
    if any(str(job.get("fun", "")).startswith("state.") for job in running):
        return None
    return master.cmd_async(minion_id, "state.highstate")


def contested_key(master: MasterApi, store_id: str, minion: str, role: str = "hypervisor") -> None:
    """Fail when a store minion's id has an accepted key and another one (denied: the master
    denies a later key for an accepted id; pending or rejected), after removing them all."""
    keys = master.list_keys()
    second = [b for b in ("minions_denied", "minions_pre", "minions_rejected")
              if minion in keys.get(b, [])]
    if minion in keys.get("minions", []) and second:
        fingerprints = master.fingerprints(minion)
        master.delete_key(minion)
        error = HypervisorKeyContested if role == "hypervisor" else MinionKeyContested
        raise error(store_id, minion, fingerprints, role)


def firstboot_stage(master: MasterApi, minion: str) -> str | None:
    """The VM's firstboot_stage grain, or None when it does not answer."""
    try:
        stage = master.cmd(minion, "grains.get", [FIRSTBOOT_STAGE_GRAIN],
                           timeout=PROBE_TIMEOUT, gather_job_timeout=PROBE_GATHER_TIMEOUT)
        return str(stage or FIRSTBOOT_STAGE_NEW)
    except SaltError:
        return None


def reset_vm(master: MasterApi, hypervisor: str, vm_name: str) -> None:
    """Hard reset of a VM that stopped answering (a hung guest): stop, then start the domain."""
    master.cmd(hypervisor, "storevirt.reset", [vm_name])


def domain_with_current_extensions(master: MasterApi, hypervisor: str,
                                   vm_name: str) -> tuple[dict[str, Any] | None, list[str]]:
    """storevirt.domain_summary of `vm_name`, asked in one job with the hypervisor's extension
    hashes; when those differ from the master's (a project update, a first run, a storevirt
    without the function) the extensions are synced and the domain asked again by the new code.
    Returns the summary and what the sync brought ([]: none was needed)."""
    hash_type, served = master.extension_hashes()
    answers = master.cmd_multi(hypervisor, [
        ("storevirt.extension_hashes", [list(HYPERVISOR_EXTENSION_FORMS), hash_type]),
        ("storevirt.domain_summary", [vm_name])])
    hashes, summary = answers["storevirt.extension_hashes"], answers["storevirt.domain_summary"]
    if hashes == served and not isinstance(summary, SaltError):
        return summary, []
    synced = sync_extensions(master, hypervisor)
    return master.cmd(hypervisor, "storevirt.domain_summary", [vm_name]), synced


def sync_extensions(master: MasterApi, minion_id: str) -> list[str]:
    """The project's utils and modules on a minion as the master has them now (its last
    highstate synced them; a rerun may come after a project update): the utils first (modules
    call them through `__utils__`), then the modules. Returns what the sync brought.

    Named environment and no blanket reload: a bare `saltutil.sync_modules` renders the minion's
    top file to find the environment and reloads every module even when nothing changed (1-2 s
    of each rerun, issue 28); top.sls has only `base`, and the reload runs only when needed."""
    quiet = {"saltenv": SALTENV, "refresh": False}
    synced = [*(master.cmd(minion_id, "saltutil.sync_utils", kwarg=quiet, timeout=60) or []),
              *(master.cmd(minion_id, "saltutil.sync_modules", kwarg=quiet, timeout=60) or [])]
    if synced:
        master.cmd(minion_id, "saltutil.refresh_modules", timeout=60)
    return synced
