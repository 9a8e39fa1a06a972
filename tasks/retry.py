"""Retry policy shared by the tasks: Prefect retries, only for failures worth retrying, told
apart by type (never by message text), on one named schedule per outside system.

A task takes its schedule from here and names the failures it retries:
`@task(name="create_vm", **SALT_VIRT_RETRY.on(SaltTransientError))`; no task spells
`retries=` or `retry_delay_seconds=` itself (tests/unit/tasks/test_retry.py reads the decorators). A
deployment may still override one task (`notify_erp.with_options(retries=...)`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypedDict


def retry_on(*transient: type[BaseException]) -> Callable[[Any, Any, Any], bool]:
    """A Prefect `retry_condition_fn` that retries only the given exception types."""

    def condition(_task: Any, _task_run: Any, state: Any) -> bool:
        try:
            state.result()
        except transient:
            return True
        except BaseException:
            return False
        return False

    return condition


class TaskRetry(TypedDict):
    """The keywords of Prefect's `@task` that a RetryPolicy fills in."""

    retries: int
    retry_delay_seconds: list[float]
    retry_condition_fn: Callable[[Any, Any, Any], bool]


@dataclass(frozen=True)
class RetryPolicy:
    """How often a task's attempt is retried and how long apart (the waits, in seconds)."""

    retries: int
    delays: tuple[float, ...]

    def on(self, *transient: type[BaseException]) -> TaskRetry:
        """The `@task` keywords: this schedule, retrying only `transient` failures."""
        return TaskRetry(retries=self.retries, retry_delay_seconds=list(self.delays),
                         retry_condition_fn=retry_on(*transient))


# Cobbler: XML-RPC to one cobblerd, which a restart (or a sync holding it) makes refuse
# connections for seconds; cheap calls, so retried often with a doubling wait (30 s in all).
# Step 2 takes it too: its transient failures are Cobbler's (and the BMC's, whose
# power calls it makes once a Cobbler record is right).
COBBLER_RETRY: Final = RetryPolicy(4, (2, 4, 8, 16))
# A BMC: an embedded controller that answers slowly after a power action or a reset.
BMC_RETRY: Final = RetryPolicy(2, (5, 15))
# The ERP over HTTP: the one retry layer of its notice (docs/reliability.md): 5 attempts,
# 52 s of waits; safe because every notice carries an Idempotency-Key.
ERP_RETRY: Final = RetryPolicy(4, (2, 5, 15, 30))
# Salt has three schedules, for three kinds of call:
# - SALT_WAIT_RETRY: the steps that wait on a minion (steps 3 and 6 wait up to their
#   timeouts and ride out a master restart inside; go-live's checks are one call on a VM
#   that just finished firstboot): a retry starts the whole wait again, so once, soon.
SALT_WAIT_RETRY: Final = RetryPolicy(1, (5,))
# - SALT_KEYS_RETRY: key and token work on the master itself (also where a Cobbler record
#   changes alongside: step 4, a replacement's retirement): quick calls, retried twice, soon.
SALT_KEYS_RETRY: Final = RetryPolicy(2, (2, 5))
# - SALT_VIRT_RETRY: libvirt through a hypervisor's minion (define, start, remove a domain),
#   busy for longer after a domain's change: retried twice, further apart.
SALT_VIRT_RETRY: Final = RetryPolicy(2, (3, 10))
# - BOX_MOVE_RETRY: a store VM's move between two boxes (a refresh): long calls that the hosts
#   record before they act, so a retry reads where the VM is and goes on; once, after a pause
#   that lets a minion that went silent come back.
BOX_MOVE_RETRY: Final = RetryPolicy(1, (30,))


class OutsideCallFailed(Exception):
    """A call to an outside system failed: `operation` (what was called), `subject` (what it was
    about: a Cobbler system, a store) and `status` (the HTTP status, when one came back); `str()`
    is the message a person reads. Each client's subclasses name the failures worth retrying."""

    def __init__(self, message: str, *, operation: str | None = None, subject: str | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.operation = operation
        self.subject = subject
        self.status = status
# The region's backup server (restic over HTTPS, tasks/backup.py): a server busy with another
# store's upload, or a repository another restic holds locked for a moment, answers again within
# a minute; retried twice, further apart.
BACKUP_RETRY: Final = RetryPolicy(2, (10, 30))
