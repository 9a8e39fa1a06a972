"""The KIWI step's exception tree; every error carries the description directory it concerns.

::

    KiwiTaskError
    +-- KiwiDescriptionError (ValueError)   the image description is invalid (permanent)
    +-- BuildParamsError (ValueError)       build parameters missing or malformed (permanent)
    +-- KiwiBuildError (RuntimeError)       kiwi-ng / qemu-img failed
        +-- KiwiBuildTimeout                the build ran past its time limit
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BuildParamsError",
    "KiwiBuildError",
    "KiwiBuildTimeout",
    "KiwiDescriptionError",
    "KiwiTaskError",
]


class KiwiTaskError(Exception):
    """Something in the KIWI image step failed."""

    def __init__(self, message: str, *, desc_dir: Path | None = None) -> None:
        super().__init__(message)
        self.desc_dir = desc_dir


class KiwiDescriptionError(KiwiTaskError, ValueError):
    """The image description (config.xml, config.sh or the root/ overlay) is invalid."""

    def __init__(self, desc_dir: Path, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid image description {desc_dir}:\n{lines}", desc_dir=desc_dir)


class BuildParamsError(KiwiTaskError, ValueError):
    """The build parameters are missing a placeholder's value or hold a malformed value."""

    def __init__(self, desc_dir: Path, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"bad build parameters for {desc_dir}:\n{lines}", desc_dir=desc_dir)


class KiwiBuildError(KiwiTaskError, RuntimeError):
    """kiwi-ng (or qemu-img) did not produce the image."""

    def __init__(
        self,
        message: str,
        *,
        desc_dir: Path | None = None,
        log_tail: list[str] | None = None,
        returncode: int | None = None,
    ) -> None:
        super().__init__(message, desc_dir=desc_dir)
        self.log_tail = list(log_tail or [])
        self.returncode = returncode


class KiwiBuildTimeout(KiwiBuildError):
    """The build ran past its time limit and was stopped."""
