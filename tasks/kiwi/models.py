"""What the KIWI step's parts hand each other: description info, build output, cached image."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["BuildOutput", "Builder", "DescriptionInfo", "ImageRef", "LineSink"]

LineSink = Callable[[str], None]
"""Where a builder sends its log lines (``logger.info``, ``list.append``)."""


class DescriptionInfo(BaseModel):
    """What KIWI reads from a valid description for the selected profile."""

    model_config = ConfigDict(frozen=True)

    desc_dir: str
    name: str
    version: str
    profiles: list[str]
    image_type: str
    format: str | None
    packages: list[str]
    bootstrap_packages: list[str]


class ImageRef(BaseModel):
    """A cached image: where it is and what producing it cost in this call."""

    model_config = ConfigDict(frozen=True)

    key: str
    path: Path
    meta: dict[str, Any] = Field(default_factory=dict)
    cache_hit: bool
    build_seconds: float
    kiwi_seconds: float
    seconds: float


@dataclass(frozen=True)
class BuildOutput:
    """What a builder hands back to the cache: the qcow2 and what KIWI reported."""

    image: Path
    kiwi_seconds: float
    kiwi_result: dict[str, Any] | None
    image_name: str
    extra_files: dict[str, Path] = field(default_factory=dict)


class Builder(Protocol):
    """Turns a description + parameters into a qcow2 inside ``work_dir``."""

    @property
    def tag(self) -> str:
        """Identifies the builder (and its version) in the cache key and meta.json."""
        ...

    def build(
        self, desc_dir: Path, params: Mapping[str, str], work_dir: Path, log: LineSink
    ) -> BuildOutput:
        """Build the image; raise a :class:`KiwiTaskError` subclass on failure."""
        ...
