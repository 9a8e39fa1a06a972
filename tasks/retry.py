"""Retry policy shared by the tasks: Prefect retries, only for failures worth retrying, told
apart by type (never by message text)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


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
