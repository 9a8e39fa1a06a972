"""What can go wrong with Salt, as types that carry what failed: retries key on the type
(`SaltTransientError` and its subclasses), callers read the fields, never the message text."""

from __future__ import annotations

from tasks.salt.masterlog import AuthRefusal


class SaltError(Exception):
    """A Salt operation failed. `operation` names the call or wait (`key.list_all`,
    `state.highstate`, `store/hypervisor/ready`), `minion_id` its target, `master_config` the
    master it went to, when known."""

    def __init__(self, message: str, *, operation: str | None = None,
                 minion_id: str | None = None, master_config: str | None = None) -> None:
        super().__init__(message)
        self.operation, self.minion_id, self.master_config = operation, minion_id, master_config


class SaltTransientError(SaltError):
    """A failure worth retrying: a minion did not answer, the bus timed out."""


class SaltMinionNoResponse(SaltTransientError):
    """The targeted minion did not return within the timeout."""

    def __init__(self, minion_id: str, fun: str, timeout: float) -> None:
        super().__init__(f"minion {minion_id!r} did not answer {fun} within {timeout:.0f}s",
                         operation=fun, minion_id=minion_id)
        self.timeout = timeout


class SaltEventTimeout(SaltTransientError):
    """An awaited event did not arrive in time; `timeout` is how long it was awaited."""

    def __init__(self, message: str, *, operation: str | None = None,
                 minion_id: str | None = None, timeout: float | None = None) -> None:
        super().__init__(message, operation=operation, minion_id=minion_id)
        self.timeout = timeout


class SaltMasterUnavailable(SaltTransientError):
    """The master did not take the request (not running, restarting, its socket gone)."""

    def __init__(self, master_config: str, operation: str, cause: BaseException) -> None:
        super().__init__(f"Salt master ({master_config}) did not take {operation}: "
                         f"{type(cause).__name__}: {cause}",
                         operation=operation, master_config=master_config)
        self.cause = cause


class SaltCommandFailed(SaltError):
    """The minion answered with a non-zero retcode."""

    def __init__(self, minion_id: str, fun: str, retcode: int, detail: str) -> None:
        super().__init__(f"{fun} on {minion_id!r} failed (retcode {retcode}): {detail}",
                         operation=fun, minion_id=minion_id)
        self.fun, self.retcode, self.detail = fun, retcode, detail


class HypervisorMinionRefused(SaltError):
    """The master refused sign-ins as the hypervisor's id for its auth protocol and the host
    never got ready within step 3's timeout (not retried: a rerun would wait as long)."""

    def __init__(self, store_id: str, refusal: AuthRefusal, master_config: str) -> None:
        super().__init__(
            f"store {store_id}: the Salt master refuses hypervisor minion {refusal.minion}: it "
            f"signs in with auth protocol {refusal.version}, the master requires at least "
            f"{refusal.minimum} (minimum_auth_version). Fix one of: run a minion that speaks "
            f"protocol {refusal.minimum} on the host (upstream Salt 3006.12 or later, or SUSE's "
            f"3006.0 package from 3006.0-150500.4.55.1: update the host; docs/production.md, "
            f"'Salt on the store hosts'), or "
            f"set `minimum_auth_version: {refusal.version}` in {master_config} and restart the "
            "master (it then accepts the older protocol from every minion). A sign-in needs no "
            "key: if the host's Salt is new enough, a machine on the store network claimed its "
            "id, and the host itself never signed in",
            operation="auth", minion_id=refusal.minion, master_config=master_config)
        self.store_id, self.refusal = store_id, refusal


class MinionKeyContested(SaltError):
    """Two keys claim a store minion's id (the hypervisor's or the VM's): another machine
    signed in with its one-time token, before or after the machine itself. Both keys are
    removed and nothing goes on with either (not retried: a person decides)."""

    FIX = {"hypervisor": "Check the store network, then rerun the rollout: it reinstalls the "
                         "host with a new token",
           "VM": "Check the store's machines, then rerun the rollout asking for recreate_vm: "
                 "the VM is made anew with a new token"}

    def __init__(self, store_id: str, minion: str, fingerprints: dict[str, list[str]],
                 role: str = "hypervisor") -> None:
        accepted = ", ".join(fingerprints.get("minions", [])) or "none"
        others = "; ".join(f"{bucket.removeprefix('minions_')} {', '.join(found)}"
                           for bucket, found in fingerprints.items() if bucket != "minions")
        super().__init__(
            f"store {store_id}: two keys claim {role} minion {minion}: accepted {accepted}, "
            f"{others or 'denied none'}. Another machine signed in with the {role}'s one-time "
            "token: both keys were removed and nothing more was sent to either. "
            f"{self.FIX[role]} (docs/design.md, 'Threat model')",
            operation="key.list_all", minion_id=minion)
        self.store_id, self.minion, self.fingerprints = store_id, minion, fingerprints


class HypervisorKeyContested(MinionKeyContested):
    """Two keys claim the hypervisor's id (step 3)."""


class HypervisorWrongHardware(SaltError):
    """The installed host reports another SMBIOS serial than the inventory gives: another box
    than the store's. Nothing more is done on it (not retried)."""

    def __init__(self, store_id: str, minion: str, expected: str, reported: str | None) -> None:
        found = f"serial {reported!r}" if reported else "no serial (its SMBIOS has none)"
        super().__init__(
            f"store {store_id}: hypervisor {minion} reports {found}, but the inventory's "
            f"hypervisor.serial is {expected!r}: this is not the store's box. Nothing was done "
            "on it after its install (no VM keys, no VM). If the box is the store's, correct "
            "hypervisor.serial in the inventory and roll out again; if not, rack the store's "
            f"own box (serial {expected!r}) and roll out with its MAC",
            operation="grains.get", minion_id=minion)
        self.store_id, self.expected, self.reported = store_id, expected, reported


class FirstbootFailed(Exception):
    """A firstboot state run on the VM failed; carries the failing states."""

    def __init__(self, store_id: str, minion: str, states: list[dict[str, str]], raw: str) -> None:
        detail = "; ".join(f"{s['id']}: {s['comment']}" for s in states) or raw
        super().__init__(f"store {store_id}: firstboot on {minion} failed: {detail}")
        self.store_id, self.minion_id, self.states, self.raw = store_id, minion, states, raw


class VmNeverContacted(Exception):
    """The VM's minion never reached the master: not transient, a retry would wait again.

    Says what a technician needs: the master address the image was built with, and where to
    look (the VM's console on its hypervisor)."""

    def __init__(self, store_id: str, minion: str, waited: float, *, master_address: str,
                 master_port: str, vm_name: str, hypervisor: str) -> None:
        super().__init__(
            f"store {store_id}: VM minion {minion} never contacted the master "
            f"within {waited:.0f}s of step 6 (awaited its key and its "
            f"salt/minion/{minion}/start event; neither came). The guest did not "
            f"boot or cannot reach the master at {master_address}:{master_port}, the address "
            "its image was built with (image_params SALT_MASTER/SALT_MASTER_PORT): check the "
            f"VM's console (`virsh console {vm_name}` on {hypervisor}) "
            "and its /etc/salt/minion.d/00-master.conf")
        self.store_id, self.minion_id, self.waited = store_id, minion, waited
        self.master_address, self.master_port = master_address, master_port
