"""tasks/kiwi/task.py: ensure_image, the Prefect task the flows call, run as a flow runs it (on a
throwaway Prefect server): it builds the image into the cache once, answers from the cache after,
and refuses an unknown builder before touching anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from tasks.kiwi import ensure_image
from tests.kiwi_helpers import DEBIAN, PARAMS, desc_dir


@flow(name="ensure-image-only")
def image_step(cache_dir: str, builder: str = "lab") -> Any:
    return ensure_image(str(desc_dir(DEBIAN)), {**PARAMS, "KIWI_PROFILE": "Disk"}, cache_dir, builder,
                        return_state=True)


def test_ensure_image_builds_once_then_answers_from_the_cache(prefect_harness: None,
                                                              tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = image_step(str(cache)).result()
    assert first["cache_hit"] is False and first["kiwi_seconds"] > 0
    assert Path(first["path"]) == cache / first["key"] / "image.qcow2"
    assert Path(first["path"]).is_file() and first["sha256"] == first["meta"]["sha256"]
    again = image_step(str(cache)).result()
    assert again["cache_hit"] is True and again["key"] == first["key"]
    assert again["build_seconds"] == 0 and again["kiwi_seconds"] == 0


def test_ensure_image_refuses_an_unknown_builder_and_builds_nothing(prefect_harness: None,
                                                                    tmp_path: Path) -> None:
    state = image_step(str(tmp_path / "cache"), builder="docker", return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match="unknown builder 'docker'; expected one of kiwi, lab"):
        state.result()
    assert not (tmp_path / "cache").exists()
