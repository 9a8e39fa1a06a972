"""The real image build: ``kiwi-ng system build`` on a copy of the description (needs root),
its parameters and the minion's wheelhouse added to the copy; a description made for OBS
(``obsrepositories:/``) builds from its ``imageonly`` repositories
(:func:`~tasks.kiwi.inprocess.local_repo_args`).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from kiwi.version import __version__ as KIWI_VERSION

from store_rollout.private_files import write_private
from tasks.kiwi.errors import KiwiBuildError, KiwiBuildTimeout
from tasks.kiwi.inprocess import local_repo_args
from tasks.kiwi.models import BuildOutput, LineSink
from tasks.kiwi.overlay import BUILD_PARAMS_FILE, MINION_LOCK, MINION_WHEELHOUSE
from tasks.kiwi.params import kiwi_profile
from tasks.kiwi.validate import validate_description

__all__ = ["KIWI_BUILD_TIMEOUT", "KIWI_VERSION", "KiwiBuilder"]

KIWI_BUILD_TIMEOUT = 20 * 60.0
"""kiwi-ng ``system build`` limit in seconds (a Debian disk build takes 4-5 min)."""
WHEELHOUSE_TIMEOUT = 15 * 60.0
"""``pip wheel`` of a description's minion lock (Salt is an sdist: built once per host cache)."""
_ERROR_LINE_RE = re.compile(r"\[ ERROR\s*\]|\bKiwi[A-Za-z]+:")


def _kiwi_ng_path() -> str:
    local = Path(sys.executable).parent / "kiwi-ng"
    return str(local) if local.exists() else (shutil.which("kiwi-ng") or "kiwi-ng")


class KiwiBuilder:
    """Runs ``kiwi-ng system build`` on a copy of the description (needs root)."""

    def __init__(
        self,
        *,
        shared_cache_dir: Path,
        kiwi_ng: str | None = None,
        timeout: float = KIWI_BUILD_TIMEOUT,
    ) -> None:
        self.shared_cache_dir = Path(shared_cache_dir)
        self.kiwi_ng = kiwi_ng or _kiwi_ng_path()
        self.timeout = timeout

    @property
    def tag(self) -> str:
        """``kiwi-<version>``: a KIWI upgrade makes new cache entries."""
        return f"kiwi-{KIWI_VERSION}"

    def command(self, desc_copy: Path, profile: str | None, work_dir: Path,
                repo_args: Sequence[str] = ()) -> list[str]:
        """The kiwi-ng command line (global options before the subcommand, ``repo_args``
        from :func:`local_repo_args` after it)."""
        cmd = [self.kiwi_ng]
        if profile:
            cmd += ["--profile", profile]
        cmd += [
            "--logfile", str(work_dir / "kiwi.log"),
            "--temp-dir", str(work_dir / "kiwi-tmp"),
            "--shared-cache-dir", str(self.shared_cache_dir),
            "system", "build",
            *repo_args,
            "--description", str(desc_copy),
            "--target-dir", str(work_dir / "target"),
        ]  # fmt: skip
        return cmd

    @staticmethod
    def prepare_description(desc_dir: Path, params: Mapping[str, str], dest: Path) -> Path:
        """Copy ``desc_dir`` (symlinks resolved) to ``dest`` and add the build-params file."""
        shutil.copytree(desc_dir, dest, symlinks=False)
        params_file = dest / "root" / BUILD_PARAMS_FILE
        params_file.parent.mkdir(parents=True, exist_ok=True)
        write_private(params_file,
                      "# store-rollout build parameters, applied and removed by config.sh\n"
                      + "".join(f"{k}={v}\n" for k, v in sorted(params.items())))
        return dest

    @staticmethod
    def add_wheelhouse(desc_copy: Path, timeout: float = WHEELHOUSE_TIMEOUT,
                       pip: Sequence[str] = (sys.executable, "-m", "pip")) -> Path | None:
        """Wheels of the copy's ``MINION_LOCK`` into its overlay, made with this host's pip
        (its index and proxy settings): the chroot of the build then needs no index."""
        lock = desc_copy / MINION_LOCK
        if not lock.is_file():
            return None
        wheelhouse = desc_copy / "root" / MINION_WHEELHOUSE
        wheelhouse.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lock, wheelhouse / MINION_LOCK)
        cmd = [*pip, "wheel", "--quiet", "--no-deps",
               "--requirement", str(lock), "--wheel-dir", str(wheelhouse)]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise KiwiBuildTimeout(f"pip wheel of {lock.name} exceeded {timeout:.0f} s",
                                   desc_dir=desc_copy) from exc
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-20:]
            raise KiwiBuildError(
                f"pip wheel of the image's {lock.name} failed (rc {proc.returncode}): "
                f"{tail[-1] if tail else 'no output'}",
                desc_dir=desc_copy, log_tail=tail, returncode=proc.returncode)
        return wheelhouse

    def build(
        self, desc_dir: Path, params: Mapping[str, str], work_dir: Path, log: LineSink
    ) -> BuildOutput:
        """Validate, then ``kiwi-ng system build``; stream console lines to ``log``."""
        if os.geteuid() != 0:
            raise KiwiBuildError("kiwi-ng system build needs root", desc_dir=desc_dir)
        started = time.monotonic()
        profile = kiwi_profile(params)
        validate_description(desc_dir, profile, params=params, temp_dir=work_dir / "kiwi-tmp")
        desc_copy = self.prepare_description(desc_dir, params, work_dir / "description")
        wheelhouse = self.add_wheelhouse(desc_copy)
        if wheelhouse is not None:
            log(f"wheelhouse for {MINION_LOCK}: {len(list(wheelhouse.glob('*.whl')))} wheels")
        (work_dir / "kiwi-tmp").mkdir(exist_ok=True)
        self.shared_cache_dir.mkdir(parents=True, exist_ok=True)
        repo_args = local_repo_args(desc_copy / "config.xml", profile, work_dir / "kiwi-tmp")
        cmd = self.command(desc_copy, profile, work_dir, repo_args)
        log("running: " + " ".join(cmd))
        returncode, tail = self._run(cmd, desc_dir, log)
        kiwi_seconds = time.monotonic() - started
        if returncode != 0:
            errors = [line for line in tail if _ERROR_LINE_RE.search(line)]
            last = errors[-1] if errors else (tail[-1] if tail else "no output")
            raise KiwiBuildError(
                f"kiwi-ng system build of {desc_dir} failed (rc {returncode}): {last}",
                desc_dir=desc_dir,
                log_tail=tail,
                returncode=returncode,
            )
        result_file = work_dir / "target" / "kiwi.result.json"
        try:
            result = json.loads(result_file.read_text(encoding="utf-8"))
            image = Path(result["disk_format_image"]["filename"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KiwiBuildError(
                f"{result_file}: no disk_format_image ({type(exc).__name__}: {exc}); "
                "only oem/qcow2 types can be cached",
                desc_dir=desc_dir,
                log_tail=tail,
            ) from exc
        extra: dict[str, Path] = {}
        packages = result.get("image_packages", {}).get("filename")
        if packages and Path(packages).is_file():
            extra["image.packages"] = Path(packages)
        name = image.name.split(".")[0]
        return BuildOutput(
            image=image, kiwi_seconds=kiwi_seconds, kiwi_result=result,
            image_name=name, extra_files=extra,
        )  # fmt: skip

    def _run(self, cmd: list[str], desc_dir: Path, log: LineSink) -> tuple[int, list[str]]:
        """Run kiwi-ng, split its console on CR/LF, feed lines to ``log``; keep a tail."""
        tail: list[str] = []
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as exc:
            raise KiwiBuildError(f"cannot run {cmd[0]}: {exc}", desc_dir=desc_dir) from exc
        assert proc.stdout is not None
        deadline = time.monotonic() + self.timeout
        buf = b""
        fd = proc.stdout.fileno()
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise KiwiBuildTimeout(
                        f"kiwi-ng system build of {desc_dir} exceeded {self.timeout:.0f} s",
                        desc_dir=desc_dir,
                        log_tail=tail,
                    )
                ready, _, _ = select.select([fd], [], [], min(remaining, 5.0))
                if not ready:
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = re.split(rb"[\r\n]", buf)
                for raw in lines:
                    line = raw.decode("utf-8", "replace").rstrip()
                    if line:
                        log(line)
                        tail = (tail + [line])[-50:]
            if buf.strip():
                line = buf.decode("utf-8", "replace").rstrip()
                log(line)
                tail = (tail + [line])[-50:]
            return proc.wait(timeout=60), tail
        finally:
            if proc.poll() is None:
                proc.terminate()  # kiwi-ng cleans up its mounts/loop devices on SIGTERM
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            proc.stdout.close()
