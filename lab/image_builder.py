"""The lab's image builder and what its simulator starts in place of the image's minion.

* :class:`LabBuilder`: KIWI validation + a qcow2 that only halts, from ``qemu-img``; selected
  as ``image_builder=lab`` (the lab's settings file), registered in the entry point group
  ``store_rollout.image_builders`` by lab/pyproject.toml (:func:`lab_builder`).
* :func:`render_minion_d`: the ``minion.d`` files as they end up in the image, which the
  simulator gives the minion of a VM whose disk only halts (lab/simulator/vm_boot.py).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tasks.kiwi import (
    BuildOutput,
    KiwiBuildError,
    KiwiBuildTimeout,
    kiwi_profile,
    minion_d_dir,
    resolve_params,
    substitute,
    validate_description,
)

LAB_DISK_SIZE = "64M"
QEMU_IMG_TIMEOUT = 60.0

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
        self, desc_dir: Path, params: Mapping[str, str], work_dir: Path,
        log: Callable[[str], None],
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
            # a payload of incompressible data, so a test can time its transfer over a store's
            # link (lab/wan.py); none by default: the lab's images stay small
            disk.seek(1 << 20)
            for _ in range(int(params.get("LAB_PAYLOAD_MIB", "0"))):
                disk.write(os.urandom(1 << 20))
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


def lab_builder(cache_dir: Path) -> LabBuilder:
    """The entry point ``make_builder`` calls with the image cache directory (unused here)."""
    return LabBuilder()


def render_minion_d(desc_dir: Path, params: Mapping[str, str]) -> dict[str, str]:
    """The ``minion.d`` files as they end up in the image, placeholders substituted (what the
    image's ``apply-build-params`` does in a real build).

    Args:
        desc_dir: The description directory.
        params: Build parameters (defaults applied).

    Returns:
        File name -> text, e.g. ``{"00-master.conf": 'master: "10.0.0.1"\\n...'}``.

    Raises:
        BuildParamsError: A placeholder has no value or a value is malformed.
    """
    effective = resolve_params(desc_dir, params)
    out: dict[str, str] = {}
    for path in sorted(p for p in minion_d_dir(desc_dir).iterdir() if p.is_file()):
        text = path.read_text(encoding="utf-8")
        out[path.name] = substitute(text, effective) if path.suffix == ".conf" else text
    return out
