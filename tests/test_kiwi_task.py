"""tasks/kiwi/task.py: ensure_image is the Prefect task the flows call."""

from __future__ import annotations

from tasks.kiwi import ensure_image


def test_ensure_image_is_a_named_prefect_task() -> None:
    assert ensure_image.task_run_name == "image-{description}"
    assert list(ensure_image.fn.__annotations__) == [
        "description", "params", "cache_dir", "builder", "return"]  # fmt: skip
