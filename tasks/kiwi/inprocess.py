"""KIWI used as a library, in this process: the checks ``kiwi-ng system build`` runs first.

:func:`kiwi_problems` loads a ``config.xml`` with KIWI's own ``XMLDescription`` (XSLT upgrade +
RelaxNG + Schematron), selects the profile with ``XMLState`` and runs the ``RuntimeChecker``
checks; :func:`explain_schema_errors` says *what* broke the schema when KIWI only says "invalid";
:func:`local_repo_args` is what a local ``kiwi-ng`` needs to build a description made for OBS.

KIWI temp files: KIWI writes its XSLT/markup temp files under ``kiwi.defaults.TEMP_DIR``
(hard-coded ``/var/tmp``, no environment variable; ``TMPDIR`` is ignored because KIWI passes
``dir=`` explicitly). ``Defaults.set_temp_location()`` (what ``kiwi-ng --temp-dir`` calls) moves
it, so in-process validation points it at a private temporary directory and ``kiwi-ng`` gets
``--temp-dir``.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import kiwi.defaults
from kiwi.defaults import Defaults
from kiwi.exceptions import KiwiDescriptionInvalid, KiwiError
from kiwi.markup import Markup
from kiwi.runtime_checker import RuntimeChecker
from kiwi.xml_description import XMLDescription
from kiwi.xml_state import XMLState
from lxml import etree, isoschematron

from tasks.kiwi.errors import KiwiDescriptionError
from tasks.kiwi.models import DescriptionInfo

__all__ = [
    "OBS_REPOSITORIES",
    "RUNTIME_CHECKS",
    "explain_schema_errors",
    "kiwi_problems",
    "local_repo_args",
]

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
OBS_REPOSITORIES = "obsrepositories:/"
"""A build repository only an OBS worker resolves (KIWI elsewhere: "Only the buildservice can
use the obsrepositories schema")."""
_REPO_CHECKS_AFTER_ARGS = ("check_repositories_configured",
                           "check_image_include_repos_publicly_resolvable")
"""kiwi/tasks/base.py checks_after_command_args: what ``system build`` checks once the
repository options are applied."""
_GENERIC_RNG_ERRORS = frozenset(
    {"RELAXNG_ERR_INTEREXTRA", "RELAXNG_ERR_CONTENTVALID", "RELAXNG_ERR_INTERSEQ"}
)
_SVRL = {"svrl": "http://purl.oclc.org/dsdl/svrl"}

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


def kiwi_problems(
    config_xml: Path, profile: str | None, temp_dir: Path | None
) -> tuple[list[str], DescriptionInfo | None]:
    """KIWI's problems with ``config_xml`` for ``profile``, and what it read when it could load it."""
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


def local_repo_args(
    config_xml: Path, profile: str | None, temp_dir: Path | None = None
) -> list[str]:
    """The ``kiwi-ng system build`` options a local build of ``config_xml`` needs.

    A description that builds on OBS has :data:`OBS_REPOSITORIES` as its build repository
    (OBS refuses a plain URL as one) and the distribution's repositories as ``imageonly`` (the
    image's zypper configuration). A local build drops the build repositories
    (``--ignore-repos-used-for-build``) and builds from the ``imageonly`` ones
    (``--add-repo``, not marked for the image: it carries them once, as ``imageonly``; same
    alias, which keeps KIWI's shared cache of them from one build to the next: without one
    KIWI makes up a random alias per build). Any other description needs no option.

    Args:
        config_xml: The description's ``config.xml``.
        profile: KIWI profile to select (``None``: the ``import="true"`` profiles).
        temp_dir: Where KIWI may write its temp files (default: a private temp dir).

    Returns:
        E.g. ``["--ignore-repos-used-for-build", "--add-repo",
        "https://download.opensuse.org/distribution/leap/16.0/repo/oss,rpm-md,repo-oss", ...]``,
        or ``[]``.

    Raises:
        KiwiDescriptionError: KIWI cannot load the description, it builds only from
            :data:`OBS_REPOSITORIES` and has no ``imageonly`` repository, or KIWI's checks of
            the repositories fail once the options are applied.
    """
    where = str(config_xml)
    with _kiwi_session(temp_dir):
        try:
            state = XMLState(XMLDescription(str(config_xml)).load(), [profile] if profile else [])
        except KiwiError as exc:
            raise KiwiDescriptionError(config_xml.parent, [
                f"{where}: {type(exc).__name__}: {exc}"]) from exc
        build = [r.get_source().get_path() for r in state.get_repository_sections_used_for_build()]
        if OBS_REPOSITORIES not in build:
            return []
        image_only = [r for r in state.get_repository_sections() if r.get_imageonly()]
        if not image_only:
            raise KiwiDescriptionError(config_xml.parent, [
                f"{where}: builds from {OBS_REPOSITORIES} (OBS only) and has no imageonly "
                "repository a local build could use instead"])
        args = ["--ignore-repos-used-for-build"]
        state.delete_repository_sections_used_for_build()
        for repo in image_only:
            source, repo_type, alias = (repo.get_source().get_path(), repo.get_type(),
                                        repo.get_alias())
            args += ["--add-repo", ",".join([source, repo_type or "", alias or ""]).rstrip(",")]
            state.add_repository(source, repo_type, alias)
        checker = RuntimeChecker(state)
        problems = []
        for name in _REPO_CHECKS_AFTER_ARGS:
            try:
                getattr(checker, name)()
            except KiwiError as exc:
                problems.append(f"{where}: {type(exc).__name__}: {' '.join(str(exc).split())}")
        if problems:
            raise KiwiDescriptionError(config_xml.parent, problems)
    return args
