"""The two builders that turn a description + parameters into a qcow2 (see :class:`Builder`),
and :func:`make_builder`, which picks one by name.

* :class:`LabBuilder` (here): KIWI validation + a qcow2 that only halts, from ``qemu-img``; for
  the lab, where the VM's minion is started with :func:`render_minion_d` output.
* :class:`~tasks.kiwi.kiwi_ng.KiwiBuilder`: ``kiwi-ng system build`` on a copy of the
  description (needs root).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tasks.kiwi.errors import KiwiBuildError, KiwiBuildTimeout
from tasks.kiwi.kiwi_ng import KiwiBuilder
from tasks.kiwi.models import Builder, BuildOutput, LineSink
from tasks.kiwi.params import kiwi_profile
from tasks.kiwi.validate import validate_description

__all__ = [
    "BUILDERS",
    "LAB_DISK_SIZE",
    "QEMU_IMG_TIMEOUT",
    "LabBuilder",
    "make_builder",
]

LAB_DISK_SIZE = "64M"
QEMU_IMG_TIMEOUT = 60.0
BUILDERS = ("lab", "kiwi")
"""What :func:`make_builder` and ``ensure_image`` accept."""


# The lab disk's boot sector: cli; hlt; jmp back to hlt. The firmware boots it and the vCPU
# halts for good (an empty disk left the firmware retrying the boot: twice the idle CPU).
HALT_BOOT_SECTOR = bytes([0xFA, 0xF4, 0xEB, 0xFD]).ljust(510, b"\0") + b"\x55\xaa"


class LabBuilder:
    """Validates with KIWI, then makes a qcow2 base image with ``qemu-img`` whose only content is
    a boot sector that halts the CPU.

    For the lab, where the VM's minion is started with :func:`render_minion_d` output.
    """

    tag = "lab-v2"

    def __init__(self, *, qemu_img: str = "qemu-img", timeout: float = QEMU_IMG_TIMEOUT) -> None:
        self.qemu_img = qemu_img
        self.timeout = timeout

    def build(
        self, desc_dir: Path, params: Mapping[str, str], work_dir: Path, log: LineSink
    ) -> BuildOutput:
        """Validate ``desc_dir`` and create ``work_dir/image.qcow2`` (``LAB_DISK_SIZE``)."""
        started = time.monotonic()
        info = validate_description(
            desc_dir, kiwi_profile(params), params=params, temp_dir=work_dir / "kiwi-tmp"
        )
        kiwi_seconds = time.monotonic() - started
        log(f"KIWI validated {info.name} {info.version} ({info.image_type}/{info.format})")
        image = work_dir / "image.qcow2"
        size = params.get("LAB_DISK_SIZE", LAB_DISK_SIZE)
        raw = work_dir / "image.raw"
        self._qemu_img(["create", "-q", "-f", "raw", str(raw), size], desc_dir)
        with raw.open("r+b") as disk:  # sparse but for its first sector
            disk.write(HALT_BOOT_SECTOR)
        self._qemu_img(["convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(image)],
                       desc_dir)
        raw.unlink()
        return BuildOutput(
            image=image,
            kiwi_seconds=kiwi_seconds,
            kiwi_result={"validated": info.model_dump()},
            image_name=info.name,
        )

    def _qemu_img(self, args: Sequence[str], desc_dir: Path) -> None:
        cmd = [self.qemu_img, *args]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise KiwiBuildTimeout(f"{cmd[0]} {args[0]} timed out", desc_dir=desc_dir) from exc
        except OSError as exc:
            raise KiwiBuildError(f"cannot run {cmd[0]}: {exc}", desc_dir=desc_dir) from exc
        if proc.returncode != 0:
            raise KiwiBuildError(
                f"qemu-img {args[0]} failed: {proc.stderr.strip()}",
                desc_dir=desc_dir,
                returncode=proc.returncode,
            )


def make_builder(name: str, cache_dir: Path) -> Builder:
    """``lab`` -> :class:`LabBuilder`; ``kiwi`` -> :class:`KiwiBuilder` (shared cache inside
    ``cache_dir/_kiwi-shared-cache``)."""
    if name == "lab":
        return LabBuilder()
    if name == "kiwi":
        return KiwiBuilder(shared_cache_dir=cache_dir / "_kiwi-shared-cache")
    raise ValueError(f"unknown builder {name!r}; expected one of {', '.join(BUILDERS)}")
