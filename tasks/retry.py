"""Retry policy shared by the tasks: Prefect retries, only for failures worth retrying."""

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
