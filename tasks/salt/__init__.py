"""Salt, as the pipeline uses it from the master host.

- `client`: `SaltMasterClient`, the thin typed client (bus, keys, LocalClient calls).
- `events`: the event bus read as `SaltEvent`s, with an injectable clock.
- `watchers`, `firstboot_watcher`: the waits of steps 3 and 6 (`HypervisorReadyWatcher`,
  `FirstbootWatcher`).
- `probes`: one question to a minion, or one action on it, shared by steps and waits.
- `tokens`: the one-time autosign token store; `store_keys`: a store's keys and tokens gone
  (decommission, a replacement); `masterlog`: the master's log tail.
- `errors`: the error tree, with structured context; `runtime`: Salt's process set-up.

The names below are the package's public surface (pinned by tests/unit/tasks/test_salt_package.py);
anything else is imported from its module.
"""

from tasks.salt.client import SaltMasterClient, master_client
from tasks.salt.errors import (
    FirstbootFailed,
    HypervisorKeyContested,
    HypervisorMinionRefused,
    HypervisorWrongHardware,
    MinionKeyContested,
    SaltCommandFailed,
    SaltError,
    SaltEventTimeout,
    SaltMasterUnavailable,
    SaltMinionNoResponse,
    SaltTransientError,
    VmNeverContacted,
)
from tasks.salt.events import SaltEvent
from tasks.salt.firstboot_watcher import FirstbootWatcher
from tasks.salt.minions import key_state_in
from tasks.salt.probes import hypervisor_ready
from tasks.salt.runtime import prepare_salt_runtime
from tasks.salt.watchers import HypervisorReadyWatcher

__all__ = [
    "FirstbootFailed",
    "FirstbootWatcher",
    "hypervisor_ready",
    "HypervisorKeyContested",
    "HypervisorMinionRefused",
    "HypervisorReadyWatcher",
    "HypervisorWrongHardware",
    "key_state_in",
    "master_client",
    "MinionKeyContested",
    "prepare_salt_runtime",
    "SaltCommandFailed",
    "SaltError",
    "SaltEvent",
    "SaltEventTimeout",
    "SaltMasterClient",
    "SaltMasterUnavailable",
    "SaltMinionNoResponse",
    "SaltTransientError",
    "VmNeverContacted",
]
