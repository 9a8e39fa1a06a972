"""A batch's rows: one per store, what its `batch-stores` table and its result say of it.

Every row is a `StoreRow`, made by the constructors here (a store run as the batch's subflow, a
store skipped after its region halted, one rolled out before) or by tasks/store_runs.py (a
store run as a deployment run of its own); the wave loop (store_rollout/waves.py) reads them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from store_rollout.approval_policy import NOT_FAILED

# the columns every row has; the others only where they apply
ALWAYS: Final = frozenset({"store_id", "region", "state", "step_reached", "seconds",
                           "queued_seconds", "began", "ended", "error"})


class StoreRow(BaseModel):
    """One store of a batch. `state` is its run's final state's name (Completed, Failed, ...),
    or Skipped, Scheduled, AwaitingApproval; `seconds` its run's, `queued_seconds` how long it
    waited for its in-flight slots (or past its scheduled start), `began`/`ended` Unix times.
    `row()` gives it as the table and the result have it: a column that does not apply to this
    row (`erp_id` of a failed run, the schedule of a subflow run) is left out, not null."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store_id: str
    region: str
    state: str
    step_reached: str = "-"
    seconds: int | float = 0
    queued_seconds: int | float = 0
    began: float | None = None
    ended: float | None = None
    error: str = ""
    # the ERP's id of a store rolled out by this batch
    erp_id: str | int | None = None
    # a deployment run of its own: why it starts when it does, its run, its scheduled start
    window: str | None = None
    flow_run_id: str | None = None
    scheduled_start: str | None = None
    # rolled out before (the run that did it): left as it is
    earlier_run: str | None = None

    def row(self) -> dict[str, Any]:
        """The row as the `batch-stores` table and the batch's result hold it."""
        return self.model_dump(include=set(ALWAYS | self.model_fields_set))

    @property
    def failed(self) -> bool:
        """Not rolled out, and no person to ask: failed, or skipped (a store that waits for an
        approval, or that a person rejected, has not failed)."""
        return self.state not in NOT_FAILED

    @property
    def needs_a_person(self) -> bool:
        """Waits for an approval, or was rejected (not failed, not done)."""
        return self.state in NOT_FAILED - {"Completed"}

    @classmethod
    def skipped(cls, store_id: str, region: str, halted_after: int) -> StoreRow:
        """A store of a region whose waves halted after wave `halted_after`."""
        return cls(store_id=store_id, region=region, state="Skipped", began=None, ended=None,
                   error=f"batch halted after wave {halted_after} in region {region}")

    @classmethod
    def rolled_out_before(cls, store_id: str, region: str, flow_run_id: str,
                          earlier_run: str) -> StoreRow:
        """A store whose newest rollout run Completed: the batch leaves it as it is."""
        return cls(store_id=store_id, region=region, state="Completed", began=None, ended=None,
                   flow_run_id=flow_run_id, earlier_run=earlier_run)

    @classmethod
    def ran(cls, store_id: str, region: str, *, state: str, rolled_out: bool, message: str,
            erp_id: str | int | None, step_reached: str, timer: RunTimer) -> StoreRow:
        """A store the batch ran as its subflow: Completed with the ERP's id when
        `rolled_out`, else its state and the first 300 characters of its message."""
        row = cls(store_id=store_id, region=region, state=state, step_reached=step_reached,
                  seconds=round(timer.run_seconds, 1), queued_seconds=round(timer.waited, 1),
                  error="", began=round(timer.began, 3), ended=round(timer.ended, 3))
        if rolled_out:
            return row.model_copy(update={"state": "Completed", "erp_id": erp_id})
        return row.model_copy(update={"error": message[:300]})


class RunTimer:
    """A store run's times in a batch: how long it waited for its in-flight slots, when its
    run began and ended (wall clock), how long the run took. `clock` measures (monotonic),
    `wall` stamps; both injectable."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.clock, self.wall = clock, wall
        self.started = clock()
        self.waited = 0.0
        self.began = self.ended = 0.0
        self.run_seconds = 0.0

    def slot_taken(self) -> None:
        """The run starts now, its slots taken."""
        self.waited = self.clock() - self.started
        self.began = self.wall()

    def run_ended(self) -> None:
        """The run has ended."""
        self.ended = self.wall()
        self.run_seconds = self.clock() - self.started - self.waited
