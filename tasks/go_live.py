"""The go-live gate (step 7): the store server checked as its users need it, through the master,
before the ERP hears that the store runs.

The checks are the store server's own data (its role's services, ports and HTTP answers, free
disk, clock), run on the VM by `storegate.run` (salt_states/_modules/storegate.py); the verdict
and the table are store_rollout/go_live_report.py's. Checks that fail are asked again for
`go_live_settle_seconds` (a service may still be starting after firstboot's last reboot), then
the gate fails naming each failed check and the store; nothing is changed on the VM.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from store_rollout.contracts import GO_LIVE_FUNCTION, STORE_SERVER_CONFIG
from store_rollout.go_live_report import GoLiveReport
from store_rollout.inventory import Store
from store_rollout.settings_parts import SaltSettings
from tasks.retry import SALT_WAIT_RETRY
from tasks.salt import SaltTransientError, master_client
from tasks.salt.probes import contested_key
from tasks.store_link import LinkedCalls, StoreLink

RECHECK_SECONDS = 3.0
CHECK_TIMEOUT = 60.0


class GoLiveFailed(Exception):
    """A check of the store server failed (not retried: a rerun resumes at the gate)."""


class Checker(Protocol):
    def cmd(self, minion_id: str, fun: str, arg: list[Any] | tuple[Any, ...] = (),
            kwarg: dict[str, Any] | None = None, timeout: float = 60,
            gather_job_timeout: float | None = None) -> Any: ...


class GoLiveGate:
    """One store server's checks, asked again while some fail and the settle time lasts."""

    def __init__(self, master: Checker, store: Store, settle_seconds: float,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.master = master
        self.store = store
        self.settle_seconds = settle_seconds
        self.clock = clock
        self.sleep = sleep
        self.rounds = 0

    def check_once(self) -> GoLiveReport:
        self.rounds += 1
        rows = self.master.cmd(self.store.vm_minion_id, GO_LIVE_FUNCTION,
                               [STORE_SERVER_CONFIG, time.time()], timeout=CHECK_TIMEOUT)
        return GoLiveReport.from_rows(self.store.store_id, self.store.vm_minion_id, rows)

    def check(self) -> GoLiveReport:
        """The first report in which every check passed, else the last one at the deadline."""
        deadline = self.clock() + self.settle_seconds
        report = self.check_once()
        while not report.passed and self.clock() + RECHECK_SECONDS <= deadline:
            self.sleep(RECHECK_SECONDS)
            report = self.check_once()
        return report


@task(name="go_live_gate", **SALT_WAIT_RETRY.on(SaltTransientError))
def go_live_gate(store: Store, salt: SaltSettings) -> dict[str, Any]:
    """Step 7: check the store server; the table of checks is the run's `go-live-<store>`
    artifact. Raises GoLiveFailed naming the store and each failed check. A store whose link
    is down is waited for and asked again (tasks/store_link.py): the checks change nothing."""
    logger = get_run_logger()
    master = master_client(salt.salt_master_config)
    link = StoreLink(master, store, salt.store_link_wait_seconds)
    gate = GoLiveGate(LinkedCalls(master, link), store, salt.go_live_settle_seconds)
    contested_key(master, store.store_id, store.vm_minion_id, role="VM")
    report = gate.check()
    contested_key(master, store.store_id, store.vm_minion_id, role="VM")  # none came meanwhile
    create_table_artifact(key=f"go-live-{store.store_id.lower()}", table=report.table(),
                          description=f"store {store.store_id}: go-live checks of "
                                      f"{store.vm_minion_id} ({'passed' if report.passed else 'FAILED'})")
    if not report.passed:
        raise GoLiveFailed(report.failure())
    logger.info("store %s: go-live gate passed, %d checks on %s", store.store_id,
                len(report.checks), store.vm_minion_id)
    return {"passed": True, "checks": len(report.checks), "rounds": gate.rounds,
            "link_outages": link.outages}
