"""KIWI image builds: description checks, build parameters, a content-addressed image cache.

Layers, bottom-up:

* **Description checks** (:func:`validate_description`): KIWI's own ``XMLDescription`` (XSLT
  upgrade + RelaxNG + Schematron), ``XMLState`` and the ``RuntimeChecker`` checks ``kiwi-ng
  system build`` runs, plus what KIWI does not check: ``bash -n`` on ``config.sh`` and the
  overlay scripts, and the Salt ``minion.d`` overlay (YAML, and the keys the pipeline relies
  on). Every failure is collected into one :class:`KiwiDescriptionError`.
* **Build parameters** (:func:`resolve_params`, :func:`render_minion_d`): per-site values
  (``SALT_MASTER``, ``SALT_MASTER_PORT``) fill ``"@KEY@"`` placeholders in ``minion.d``. In a
  real build ``config.sh`` does the substitution inside the image from a ``build-params`` file
  that :class:`KiwiBuilder` writes into its copy of the description; :func:`render_minion_d`
  is the same substitution in Python.
* **Cache** (:class:`ImageCache`): ``<cache>/<key>/image.qcow2`` + ``meta.json`` keyed by
  :func:`image_key`; a hit does no KIWI work; concurrent misses for one key build once.
* **Builders**: :class:`LabBuilder` (KIWI validation + an empty qcow2 from ``qemu-img``) and
  :class:`KiwiBuilder` (``kiwi-ng system build``, needs root).
* **Prefect task** :func:`ensure_image` (the only place Prefect is used).

Exception tree (all carry the description directory they concern)::

    KiwiTaskError
    +-- KiwiDescriptionError (ValueError)   the image description is invalid (permanent)
    +-- BuildParamsError (ValueError)       build parameters missing or malformed (permanent)
    +-- KiwiBuildError (RuntimeError)       kiwi-ng / qemu-img failed
        +-- KiwiBuildTimeout                the build ran past its time limit

KIWI temp files: KIWI writes its XSLT/markup temp files under ``kiwi.defaults.TEMP_DIR``
(hard-coded ``/var/tmp``, no environment variable; ``TMPDIR`` is ignored because KIWI passes
``dir=`` explicitly). ``Defaults.set_temp_location()`` (what ``kiwi-ng --temp-dir`` calls) moves
it, so in-process validation points it at a private temporary directory and ``kiwi-ng`` gets
``--temp-dir``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import re
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import kiwi.defaults
import yaml
from kiwi.defaults import Defaults
from kiwi.exceptions import KiwiDescriptionInvalid, KiwiError
from kiwi.markup import Markup
from kiwi.runtime_checker import RuntimeChecker
from kiwi.version import __version__ as KIWI_VERSION
from kiwi.xml_description import XMLDescription
from kiwi.xml_state import XMLState
from lxml import etree, isoschematron
from prefect import get_run_logger, task
from pydantic import BaseModel, ConfigDict, Field

from store_rollout import instrument

__all__ = [
    "BuildOutput",
    "BuildParamsError",
    "Builder",
    "DEFAULT_PARAMS",
    "DescriptionInfo",
    "IMAGE_BUILDS_DIR",
    "ImageCache",
    "ImageRef",
    "KIWI_BUILD_TIMEOUT",
    "KiwiBuildError",
    "KiwiBuildTimeout",
    "KiwiBuilder",
    "KiwiDescriptionError",
    "KiwiTaskError",
    "LabBuilder",
    "ensure_image",
    "explain_schema_errors",
    "image_key",
    "render_minion_d",
    "resolve_description",
    "resolve_params",
    "validate_description",
]

# --------------------------------------------------------------------------- constants

IMAGE_BUILDS_DIR = Path(__file__).resolve().parents[1] / "image_builds"
"""Where the image descriptions live (``image_builds/<name>/config.xml``)."""

DEFAULT_PARAMS: Mapping[str, str] = {"SALT_MASTER_PORT": "4506"}
"""Build parameters with a default; every other placeholder must be passed explicitly."""

BUILDER_PARAMS = frozenset({"KIWI_PROFILE", "LAB_DISK_SIZE"})
"""Parameters read by the builders themselves (part of the key, never placeholders)."""

LAB_DISK_SIZE = "64M"
KIWI_BUILD_TIMEOUT = 20 * 60.0
"""kiwi-ng ``system build`` limit in seconds (a Debian disk build takes 4-5 min)."""
QEMU_IMG_TIMEOUT = 60.0
VALIDATE_BASH_TIMEOUT = 30.0

MINION_D = Path("etc/salt/minion.d")
BUILD_PARAMS_FILE = Path("etc/store-rollout/build-params")
"""Inside the ``root/`` overlay: KEY=value lines that ``config.sh`` applies, then removes."""
IDENTITY_SCRIPT = Path("usr/local/sbin/store-identity")
IDENTITY_UNIT = Path("etc/systemd/system/store-identity.service")
APPLY_PARAMS_SCRIPT = Path("usr/local/libexec/store-rollout/apply-build-params")
BOOTSTRAP_CONF = "90-bootstrap.conf"
FIRSTBOOT_SLS = "provisioning_helper.firstboot"
AUTOSIGN_GRAIN = "store_rollout_token"
REQUIRED_PACKAGES = ("util-linux",)
"""Packages the overlay's identity mechanism needs in every image."""

PLACEHOLDER_RE = re.compile(r"@([A-Z][A-Z0-9_]*)@")
PARAM_KEY_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
PARAM_VALUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")
SAMPLE_VALUE = "placeholder.invalid"
"""Stand-in for a placeholder without a value when only the description is checked."""

RUNTIME_CHECKS = (
    # kiwi/tasks/system_build.py checks_before/after_command_args, minus host-only checks
    # (container tool chain, target dir filesystem / shared cache location).
    "check_image_version_provided",
    "check_initrd_selection_required",
    "check_boot_description_exists",
    "check_consistent_kernel_in_boot_and_system_image",
    "check_volume_setup_defines_reserved_labels",
    "check_volume_setup_defines_multiple_fullsize_volumes",
    "check_volume_setup_has_no_root_definition",
    "check_volume_label_used_with_lvm",
    "check_swap_name_used_with_lvm",
    "check_xen_uniquely_setup_as_server_or_guest",
    "check_mediacheck_installed",
    "check_checkmedia_used_with_msdos_table",
    "check_dracut_module_for_live_iso_in_package_list",
    "check_dracut_module_for_disk_overlay_in_package_list",
    "check_dracut_module_for_disk_oem_in_package_list",
    "check_dracut_module_for_oem_install_in_package_list",
    "check_appx_naming_conventions_valid",
    "check_image_type_unique",
    "check_include_references_unresolvable",
    "check_luksformat_options_valid",
    "check_partuuid_persistency_type_used_with_mbr",
    "check_efi_fat_image_has_correct_size",
    "check_bootloader_env_compatible_with_loader",
    "check_repositories_configured",
    "check_image_include_repos_publicly_resolvable",
)
_GENERIC_RNG_ERRORS = frozenset(
    {"RELAXNG_ERR_INTEREXTRA", "RELAXNG_ERR_CONTENTVALID", "RELAXNG_ERR_INTERSEQ"}
)
_SVRL = {"svrl": "http://purl.oclc.org/dsdl/svrl"}
_ERROR_LINE_RE = re.compile(r"\[ ERROR\s*\]|\bKiwi[A-Za-z]+:")

LineSink = Callable[[str], None]
log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- errors


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


# --------------------------------------------------------------------------- models


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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


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


# --------------------------------------------------------------------------- KIWI in-process

_KIWI_LOCK = threading.Lock()  # kiwi keeps TEMP_DIR and its logger level as globals


@contextlib.contextmanager
def _kiwi_session(temp_dir: Path | None) -> Iterator[None]:
    """Serialise in-process KIWI use, silence its console logger, move its temp dir."""
    with _KIWI_LOCK, contextlib.ExitStack() as stack:
        if temp_dir is None:
            temp_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kiwi-")))
        temp_dir.mkdir(parents=True, exist_ok=True)
        kiwi_log = logging.getLogger("kiwi")
        old_level, old_temp = kiwi_log.level, kiwi.defaults.TEMP_DIR
        kiwi_log.setLevel(logging.CRITICAL + 1)
        Defaults.set_temp_location(str(temp_dir))
        try:
            yield
        finally:
            Defaults.set_temp_location(old_temp)
            kiwi_log.setLevel(old_level)


def explain_schema_errors(config_xml: Path) -> list[str]:
    """Say which element/attribute broke the schema when KIWI only says "invalid".

    Re-runs KIWI's RelaxNG + Schematron with lxml on the upgraded markup (caller holds the
    KIWI session so the markup temp file lands in the private temp dir).

    Args:
        config_xml: The description's ``config.xml``.

    Returns:
        One line per specific problem, e.g.
        ``schema: Element image has extra content: pacakges at /image/pacakges``.
    """
    try:
        markup = Markup.new(str(config_xml))  # keep the reference: its temp file dies with it
        doc = etree.parse(markup.get_xml_description())
    except KiwiError as exc:
        return [f"{type(exc).__name__}: {exc}"]
    schema = etree.parse(Defaults.get_schema_file())
    rng = etree.RelaxNG(schema)
    sch = isoschematron.Schematron(schema, store_report=True)
    out: list[str] = []
    if not rng.validate(doc):
        errs = list(rng.error_log)
        specific = [e for e in errs if e.type_name not in _GENERIC_RNG_ERRORS] or errs
        out += [f"schema: {e.message} at {e.path or f'line {e.line}'}" for e in specific]
    if not sch.validate(doc):
        for fa in sch.validation_report.xpath("//svrl:failed-assert", namespaces=_SVRL):
            text = (fa.findtext("svrl:text", namespaces=_SVRL) or "").strip()
            out.append(f"rule: {text} at {fa.get('location')}")
    return out or ["schema: KIWI reported the description invalid (no detail from lxml)"]


def _declared_profiles(config_xml: Path) -> list[str]:
    try:
        return [str(p) for p in etree.parse(str(config_xml)).xpath("/image/profiles/profile/@name")]
    except etree.XMLSyntaxError:
        return []


def _kiwi_problems(
    config_xml: Path, profile: str | None, temp_dir: Path | None
) -> tuple[list[str], DescriptionInfo | None]:
    where = f"{config_xml}"
    problems: list[str] = []
    with _kiwi_session(temp_dir):
        try:
            data = XMLDescription(str(config_xml)).load()
        except KiwiDescriptionInvalid as exc:
            if "Failed to validate" in str(exc):
                return [f"{where}: {p}" for p in explain_schema_errors(config_xml)], None
            return [f"{where}: KiwiDescriptionInvalid: {exc}"], None
        except KiwiError as exc:
            detail = f"{type(exc).__name__}: {exc}"
            try:
                etree.parse(str(config_xml))
            except etree.XMLSyntaxError as xml_exc:
                detail = f"malformed XML: {xml_exc}"
            return [f"{where}: {detail}"], None
        profiles = [profile] if profile else []
        try:
            state = XMLState(data, profiles)
        except KiwiError as exc:
            declared = ", ".join(_declared_profiles(config_xml)) or "none"
            return [
                f"{where}: {type(exc).__name__}: {exc} "
                f"(profile={profile!r}; profiles declared: {declared})"
            ], None
        checker = RuntimeChecker(state)
        for name in RUNTIME_CHECKS:
            try:
                getattr(checker, name)()
            except KiwiError as exc:
                problems.append(f"{where}: {type(exc).__name__}: {' '.join(str(exc).split())}")
        info = DescriptionInfo(
            desc_dir=str(config_xml.parent),
            name=state.xml_data.get_name(),
            version=state.get_image_version() or "",
            profiles=list(state.profiles),
            image_type=state.get_build_type_name(),
            format=state.build_type.get_format(),
            packages=sorted(state.get_system_packages()),
            bootstrap_packages=sorted(state.get_bootstrap_packages()),
        )
    return problems, info


# --------------------------------------------------------------------------- non-KIWI checks


def _bash_syntax(script: Path) -> str | None:
    proc = subprocess.run(
        ["bash", "-n", str(script)],
        capture_output=True,
        text=True,
        timeout=VALIDATE_BASH_TIMEOUT,
        check=False,
    )
    if proc.returncode == 0:
        return None
    return " ".join(proc.stderr.split()) or f"bash -n exited {proc.returncode}"


def _is_shell_script(path: Path) -> bool:
    with path.open("rb") as fh:
        first = fh.readline(200)
    return first.startswith(b"#!") and (b"bash" in first or b"/sh" in first)


def _script_problems(desc_dir: Path) -> list[str]:
    problems: list[str] = []
    config_sh = desc_dir / "config.sh"
    if not config_sh.is_file():
        return [f"{config_sh}: missing (the pipeline relies on it to apply build parameters)"]
    if not os.access(config_sh, os.X_OK):
        problems.append(f"{config_sh}: not executable (mode must be 0755)")
    if err := _bash_syntax(config_sh):
        problems.append(f"{config_sh}: bash -n: {err}")
    root = desc_dir / "root"
    if root.is_dir():
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            if _is_shell_script(path) and (err := _bash_syntax(path)):
                problems.append(f"{path}: bash -n: {err}")
    return problems


def _substitute(text: str, values: Mapping[str, str]) -> str:
    """The substitution ``apply-build-params`` does (bash ``$(<file)`` + ``printf '%s\\n'``)."""
    out = PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), text)
    return out.rstrip("\n") + "\n"


def _minion_d_dir(desc_dir: Path) -> Path:
    return desc_dir / "root" / MINION_D


def _placeholders(desc_dir: Path) -> dict[str, list[str]]:
    """Placeholder name -> minion.d files that use it."""
    found: dict[str, list[str]] = {}
    minion_d = _minion_d_dir(desc_dir)
    if minion_d.is_dir():
        for conf in sorted(minion_d.glob("*.conf")):
            for name in PLACEHOLDER_RE.findall(conf.read_text(encoding="utf-8")):
                found.setdefault(name, []).append(conf.name)
    return found


def _merge(dest: dict[str, Any], upd: Mapping[str, Any]) -> None:
    """Salt's include merge (salt.utils.dictupdate.update, recursive, lists merged)."""
    for key, value in upd.items():
        if isinstance(value, Mapping) and isinstance(dest.get(key), dict):
            _merge(dest[key], value)
        elif isinstance(value, list) and isinstance(dest.get(key), list):
            dest[key] = dest[key] + [v for v in value if v not in dest[key]]
        else:
            dest[key] = value


def _overlay_problems(desc_dir: Path, values: Mapping[str, str]) -> list[str]:
    root = desc_dir / "root"
    if not root.is_dir():
        return [f"{root}: missing root/ overlay (expected a symlink to ../overlays/salt-minion)"]
    problems: list[str] = []
    for rel, what in (
        (IDENTITY_SCRIPT, "store-identity boot script"),
        (APPLY_PARAMS_SCRIPT, "build parameter helper"),
    ):
        path = root / rel
        if not path.is_file():
            problems.append(f"{path}: missing {what}")
        elif not os.access(path, os.X_OK):
            problems.append(f"{path}: {what} not executable (mode must be 0755)")
    unit = root / IDENTITY_UNIT
    if not unit.is_file():
        problems.append(f"{unit}: missing store-identity.service unit")
    elif "Before=salt-minion.service" not in unit.read_text(encoding="utf-8"):
        problems.append(f"{unit}: [Unit] must order Before=salt-minion.service")

    minion_d = root / MINION_D
    confs = sorted(minion_d.glob("*.conf")) if minion_d.is_dir() else []
    if not confs:
        return [*problems, f"{minion_d}: no *.conf files"]
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for conf in confs:
        raw = conf.read_text(encoding="utf-8")
        docs: list[tuple[str, str]] = [("", raw)]
        if PLACEHOLDER_RE.search(raw):
            docs.append((" after placeholder substitution", _substitute(raw, values)))
        data: Any = None
        for label, text in docs:
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                hint = ' (quote placeholders: key: "@KEY@")' if "@" in text else ""
                detail = " ".join(str(exc).split())
                problems.append(f"{conf}: not valid YAML{label}{hint}: {detail}")
                data = None
                break
        if data is None:
            continue
        if not isinstance(data, dict):
            problems.append(f"{conf}: top level must be a mapping, got {type(data).__name__}")
            continue
        for key in data:
            origin[key] = conf.name
        _merge(merged, data)

    def need(cond: bool, msg: str) -> None:
        if not cond:
            problems.append(f"{minion_d}: {msg}")

    master = merged.get("master")
    need(isinstance(master, str) and bool(master), "no file sets 'master' (the Salt master)")
    grains = merged.get("grains")
    need(
        isinstance(grains, dict) and isinstance(grains.get("role"), str),
        "no file sets 'grains: {role: ...}'",
    )
    autosign = merged.get("autosign_grains")
    need(
        isinstance(autosign, list) and AUTOSIGN_GRAIN in autosign,
        f"'autosign_grains' must list {AUTOSIGN_GRAIN} (written by store-identity.service)",
    )
    need(
        merged.get("startup_states") == "sls",
        f"'startup_states: sls' missing (got {merged.get('startup_states')!r})",
    )
    sls_list = merged.get("sls_list")
    need(
        isinstance(sls_list, list) and FIRSTBOOT_SLS in sls_list,
        f"'sls_list' must contain {FIRSTBOOT_SLS} (got {sls_list!r})",
    )
    for key in ("startup_states", "sls_list"):
        if key in origin and origin[key] != BOOTSTRAP_CONF:
            problems.append(
                f"{minion_d / origin[key]}: '{key}' must live in {BOOTSTRAP_CONF} "
                f"(the file {FIRSTBOOT_SLS} removes when it is done)"
            )
    return problems


# --------------------------------------------------------------------------- public API


def resolve_description(description: str | Path) -> Path:
    """Map a description name (``leap-jeos``) or a path to its directory.

    Raises:
        KiwiDescriptionError: Neither ``image_builds/<name>`` nor the path has a config.xml.
    """
    candidate = Path(description)
    if not (candidate / "config.xml").is_file():
        candidate = IMAGE_BUILDS_DIR / str(description)
    if not (candidate / "config.xml").is_file():
        raise KiwiDescriptionError(
            candidate, [f"{candidate / 'config.xml'}: no such image description"]
        )
    return candidate


def resolve_params(desc_dir: Path, params: Mapping[str, str]) -> dict[str, str]:
    """Defaults + ``params``, checked against the placeholders the overlay uses.

    Args:
        desc_dir: The description directory.
        params: Build parameters, e.g. ``{"SALT_MASTER": "10.20.0.1"}``.

    Returns:
        The effective parameters (sorted by key).

    Raises:
        BuildParamsError: A placeholder has no value, or a key/value is malformed.
    """
    effective = {**DEFAULT_PARAMS, **params}
    problems: list[str] = []
    for key, value in sorted(effective.items()):
        if not isinstance(key, str) or not PARAM_KEY_RE.match(key):
            problems.append(f"parameter name {key!r} must match {PARAM_KEY_RE.pattern}")
        elif not isinstance(value, str) or not PARAM_VALUE_RE.match(value):
            problems.append(f"parameter {key}={value!r} must match {PARAM_VALUE_RE.pattern}")
    for name, files in sorted(_placeholders(desc_dir).items()):
        if name in BUILDER_PARAMS:
            problems.append(f"placeholder @{name}@ in {', '.join(files)} is a builder parameter")
        elif name not in effective:
            problems.append(f"no value for @{name}@ (used in minion.d/{', minion.d/'.join(files)})")
    if problems:
        raise BuildParamsError(desc_dir, problems)
    return dict(sorted(effective.items()))


def validate_description(
    desc_dir: Path,
    profile: str | None = None,
    *,
    params: Mapping[str, str] | None = None,
    temp_dir: Path | None = None,
) -> DescriptionInfo:
    """Check a description the way ``kiwi-ng system build`` would, plus the overlay.

    Args:
        desc_dir: Directory with ``config.xml``, ``config.sh`` and ``root/``.
        profile: KIWI profile to select (``None``: the ``import="true"`` profiles).
        params: Build parameters for the YAML check; missing placeholders get a sample value.
        temp_dir: Where KIWI may write its temp files (default: a private temp dir).

    Returns:
        Name, version, image type, format and packages as KIWI sees them.

    Raises:
        KiwiDescriptionError: With one entry per problem found.

    Example:
        >>> validate_description(IMAGE_BUILDS_DIR / "lab-debian", "Disk").format
        'qcow2'
    """
    desc_dir = Path(desc_dir)
    config_xml = desc_dir / "config.xml"
    if not config_xml.is_file():
        raise KiwiDescriptionError(desc_dir, [f"{config_xml}: missing"])
    values = {name: SAMPLE_VALUE for name in _placeholders(desc_dir)}
    values.update({**DEFAULT_PARAMS, **(params or {})})
    problems, info = _kiwi_problems(config_xml, profile, temp_dir)
    if info is not None:
        missing = [p for p in REQUIRED_PACKAGES if p not in info.packages]
        if missing:
            problems.append(
                f'{config_xml}: <packages type="image"> lacks {", ".join(missing)} '
                "(store-identity.service finds and mounts the STORE_SEED seed disk with blkid and mount)"
            )
    problems += _script_problems(desc_dir)
    problems += _overlay_problems(desc_dir, values)
    if problems or info is None:
        raise KiwiDescriptionError(desc_dir, problems)
    return info


def image_key(desc_dir: Path, params: Mapping[str, str], *, builder: str | None = None) -> str:
    """Content address of an image: sha256 over the description tree and the build params.

    Hashes every path (relative), file mode and file content under ``desc_dir``, following
    symlinks (so the shared ``root -> ../overlays/salt-minion`` overlay counts), then the
    effective parameters (defaults applied) sorted by key, then ``builder`` if given.

    Example:
        >>> key = image_key(IMAGE_BUILDS_DIR / "leap-jeos", {"SALT_MASTER": "10.0.0.1"})
        >>> len(key)
        64
    """
    desc_dir = Path(desc_dir)
    h = hashlib.sha256(b"store-rollout image key v1\0")
    seen: set[Path] = set()

    def walk(directory: Path, rel: str) -> None:
        real = directory.resolve()
        if real in seen:
            raise KiwiDescriptionError(desc_dir, [f"{directory}: symlink loop"])
        seen.add(real)
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            path = Path(entry.path)
            rel_path = f"{rel}{entry.name}"
            st = path.stat()  # follows symlinks
            if stat.S_ISDIR(st.st_mode):
                h.update(f"D {rel_path}/ {stat.S_IMODE(st.st_mode):o}\0".encode())
                walk(path, f"{rel_path}/")
            elif stat.S_ISREG(st.st_mode):
                h.update(f"F {rel_path} {stat.S_IMODE(st.st_mode):o} {st.st_size}\0".encode())
                with path.open("rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                h.update(b"\0")
        seen.discard(real)

    walk(desc_dir, "")
    effective = {**DEFAULT_PARAMS, **params}
    h.update(json.dumps(sorted(effective.items())).encode())
    if builder is not None:
        h.update(f"\0builder {builder}".encode())
    return h.hexdigest()


def render_minion_d(desc_dir: Path, params: Mapping[str, str]) -> dict[str, str]:
    """The ``minion.d`` files as they end up in the image, placeholders substituted.

    Args:
        desc_dir: The description directory.
        params: Build parameters (defaults applied).

    Returns:
        File name -> text, e.g. ``{"00-master.conf": 'master: "10.0.0.1"\\n...'}``.

    Raises:
        BuildParamsError: A placeholder has no value or a value is malformed.
    """
    effective = resolve_params(desc_dir, params)
    minion_d = _minion_d_dir(desc_dir)
    out: dict[str, str] = {}
    for path in sorted(p for p in minion_d.iterdir() if p.is_file()):
        text = path.read_text(encoding="utf-8")
        out[path.name] = _substitute(text, effective) if path.suffix == ".conf" else text
    return out


# --------------------------------------------------------------------------- builders


def _profile(params: Mapping[str, str]) -> str | None:
    return params.get("KIWI_PROFILE") or None


class LabBuilder:
    """Validates with KIWI, then makes an empty qcow2 base image with ``qemu-img``.

    For the lab, where the VM's minion is started with :func:`render_minion_d` output.
    """

    tag = "lab-v1"

    def __init__(self, *, qemu_img: str = "qemu-img", timeout: float = QEMU_IMG_TIMEOUT) -> None:
        self.qemu_img = qemu_img
        self.timeout = timeout

    def build(
        self, desc_dir: Path, params: Mapping[str, str], work_dir: Path, log: LineSink
    ) -> BuildOutput:
        """Validate ``desc_dir`` and create ``work_dir/image.qcow2`` (``LAB_DISK_SIZE``)."""
        started = time.monotonic()
        info = validate_description(
            desc_dir, _profile(params), params=params, temp_dir=work_dir / "kiwi-tmp"
        )
        kiwi_seconds = time.monotonic() - started
        log(f"KIWI validated {info.name} {info.version} ({info.image_type}/{info.format})")
        image = work_dir / "image.qcow2"
        size = params.get("LAB_DISK_SIZE", LAB_DISK_SIZE)
        cmd = [self.qemu_img, "create", "-q", "-f", "qcow2", str(image), size]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise KiwiBuildTimeout(f"{cmd[0]} create timed out", desc_dir=desc_dir) from exc
        except OSError as exc:
            raise KiwiBuildError(f"cannot run {cmd[0]}: {exc}", desc_dir=desc_dir) from exc
        if proc.returncode != 0:
            raise KiwiBuildError(
                f"qemu-img create failed: {proc.stderr.strip()}",
                desc_dir=desc_dir,
                returncode=proc.returncode,
            )
        return BuildOutput(
            image=image,
            kiwi_seconds=kiwi_seconds,
            kiwi_result={"validated": info.model_dump()},
            image_name=info.name,
        )


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

    def command(self, desc_copy: Path, profile: str | None, work_dir: Path) -> list[str]:
        """The kiwi-ng command line (global options before the subcommand)."""
        cmd = [self.kiwi_ng]
        if profile:
            cmd += ["--profile", profile]
        cmd += [
            "--logfile", str(work_dir / "kiwi.log"),
            "--temp-dir", str(work_dir / "kiwi-tmp"),
            "--shared-cache-dir", str(self.shared_cache_dir),
            "system", "build",
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
        params_file.write_text(
            "# store-rollout build parameters, applied and removed by config.sh\n"
            + "".join(f"{k}={v}\n" for k, v in sorted(params.items())),
            encoding="utf-8",
        )
        params_file.chmod(0o600)
        return dest

    def build(
        self, desc_dir: Path, params: Mapping[str, str], work_dir: Path, log: LineSink
    ) -> BuildOutput:
        """Validate, then ``kiwi-ng system build``; stream console lines to ``log``."""
        if os.geteuid() != 0:
            raise KiwiBuildError("kiwi-ng system build needs root", desc_dir=desc_dir)
        started = time.monotonic()
        profile = _profile(params)
        validate_description(desc_dir, profile, params=params, temp_dir=work_dir / "kiwi-tmp")
        desc_copy = self.prepare_description(desc_dir, params, work_dir / "description")
        (work_dir / "kiwi-tmp").mkdir(exist_ok=True)
        self.shared_cache_dir.mkdir(parents=True, exist_ok=True)
        cmd = self.command(desc_copy, profile, work_dir)
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


# --------------------------------------------------------------------------- cache


class ImageCache:
    """Content-addressed image store: ``<cache>/<key>/image.qcow2`` + ``meta.json``.

    Entries appear atomically (built in ``<cache>/.tmp-*`` then renamed); concurrent
    :meth:`ensure` calls for one key serialise on an ``fcntl`` lock ``<cache>/<key>.lock``.
    """

    IMAGE = "image.qcow2"
    META = "meta.json"

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = Path(cache_dir)

    def entry(self, key: str) -> Path:
        """Directory of a cache entry (it may not exist)."""
        return self.cache_dir / key

    def meta(self, key: str) -> dict[str, Any] | None:
        """The entry's meta.json, or None when the key is not cached."""
        try:
            data: dict[str, Any] = json.loads(
                (self.entry(key) / self.META).read_text(encoding="utf-8")
            )
        except (OSError, ValueError):
            return None
        return data if (self.entry(key) / self.IMAGE).is_file() else None

    def _with_digest(self, key: str) -> dict[str, Any]:
        """The entry's meta, given its image's sha256 and size once if an older cache lacks
        them (hypervisors verify their downloads against it)."""
        meta = self.meta(key) or {}
        if "sha256" not in meta:
            with self._locked(key):
                meta = self.meta(key) or {}
                if "sha256" not in meta:
                    image = self.entry(key) / self.IMAGE
                    meta.update(sha256=file_sha256(image), size=image.stat().st_size)
                    tmp = self.entry(key) / f".{self.META}.tmp"
                    tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
                    os.replace(tmp, self.entry(key) / self.META)
        return meta

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        fd = os.open(self.cache_dir / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def ensure(
        self,
        desc_dir: Path,
        params: Mapping[str, str],
        builder: Builder,
        *,
        log: LineSink | None = None,
    ) -> ImageRef:
        """Return the cached image for (description, params, builder), building on a miss.

        A hit does no KIWI work at all (``kiwi_seconds == 0``).

        Raises:
            BuildParamsError: Parameters do not fit the description's placeholders.
            KiwiDescriptionError / KiwiBuildError: From the builder on a miss.
        """
        sink: LineSink = log or (lambda line: None)
        started = time.monotonic()
        desc_dir = Path(desc_dir)
        effective = resolve_params(desc_dir, params)
        key = image_key(desc_dir, effective, builder=builder.tag)
        if self.meta(key) is None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            with self._locked(key):
                if self.meta(key) is None:
                    return self._build(desc_dir, effective, builder, key, sink, started)
        sink(f"image cache hit {key}")
        return ImageRef(
            key=key,
            path=self.entry(key) / self.IMAGE,
            meta=self._with_digest(key),
            cache_hit=True,
            build_seconds=0.0,
            kiwi_seconds=0.0,
            seconds=time.monotonic() - started,
        )

    def _build(
        self,
        desc_dir: Path,
        params: dict[str, str],
        builder: Builder,
        key: str,
        sink: LineSink,
        started: float,
    ) -> ImageRef:
        sink(f"image cache miss {key}: building {desc_dir.name} with {builder.tag}")
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=self.cache_dir))
        try:
            work = staging / "work"
            work.mkdir()
            build_started = time.monotonic()
            out = builder.build(desc_dir, params, work, sink)
            os.replace(out.image, staging / self.IMAGE)
            for name, path in out.extra_files.items():
                shutil.copy2(path, staging / name)
            shutil.rmtree(work)
            build_seconds = time.monotonic() - build_started
            meta = {
                "key": key,
                # what a hypervisor verifies its download against (storevirt.ensure_base_image)
                "sha256": file_sha256(staging / self.IMAGE),
                "size": (staging / self.IMAGE).stat().st_size,
                "description": desc_dir.name,
                "image_name": out.image_name,
                "params": params,
                "built_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "builder": builder.tag,
                "build_seconds": round(build_seconds, 3),
                "kiwi_seconds": round(out.kiwi_seconds, 3),
                "kiwi_result": out.kiwi_result,
            }
            (staging / self.META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            target = self.entry(key)
            if target.exists():  # a half entry without meta.json (manual tampering)
                shutil.rmtree(target)
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return ImageRef(
            key=key,
            path=target / self.IMAGE,
            meta=meta,
            cache_hit=False,
            build_seconds=build_seconds,
            kiwi_seconds=out.kiwi_seconds,
            seconds=time.monotonic() - started,
        )


# --------------------------------------------------------------------------- Prefect task

BUILDERS = ("lab", "kiwi")


def make_builder(name: str, cache_dir: Path) -> Builder:
    """``lab`` -> :class:`LabBuilder`; ``kiwi`` -> :class:`KiwiBuilder` (shared cache inside
    ``cache_dir/_kiwi-shared-cache``)."""
    if name == "lab":
        return LabBuilder()
    if name == "kiwi":
        return KiwiBuilder(shared_cache_dir=cache_dir / "_kiwi-shared-cache")
    raise ValueError(f"unknown builder {name!r}; expected one of {', '.join(BUILDERS)}")


@task(task_run_name="image-{description}")
def ensure_image(
    description: str, params: dict[str, str], cache_dir: str, builder: str = "lab"
) -> dict[str, Any]:
    """Make sure the image for ``description`` + ``params`` is in the cache.

    Args:
        description: Name under ``image_builds/`` (``leap-jeos``, ``lab-debian``) or a path.
        params: Build parameters, e.g. ``{"SALT_MASTER": "10.20.0.1"}``; ``KIWI_PROFILE``
            selects a KIWI profile, ``LAB_DISK_SIZE`` the lab image size.
        cache_dir: Image cache directory.
        builder: ``lab`` (validate + empty qcow2) or ``kiwi`` (real kiwi-ng build, root).

    Returns:
        ``{"key", "path", "sha256", "meta", "cache_hit", "seconds", "build_seconds",
        "kiwi_seconds"}``.

    Example:
        >>> @flow
        ... def images():
        ...     return ensure_image("lab-debian", {"SALT_MASTER": "127.0.0.1"}, "/srv/cache")
    """
    logger = get_run_logger()
    if builder not in BUILDERS:
        raise ValueError(f"unknown builder {builder!r}; expected one of {', '.join(BUILDERS)}")
    desc_dir = resolve_description(description)
    cache = Path(cache_dir)
    logger.info("Ensuring image %s with builder %s in %s", description, builder, cache)
    try:
        ref = ImageCache(cache).ensure(
            desc_dir, params, make_builder(builder, cache), log=logger.info
        )
        instrument.add("kiwi", ref.build_seconds)
    except KiwiTaskError:
        logger.exception("Image %s (builder %s) failed", description, builder)
        raise
    return {
        "key": ref.key,
        "path": str(ref.path),
        "sha256": ref.meta["sha256"],
        "meta": ref.meta,
        "cache_hit": ref.cache_hit,
        "seconds": round(ref.seconds, 3),
        "build_seconds": round(ref.build_seconds, 3),
        "kiwi_seconds": round(ref.kiwi_seconds, 3),
    }
