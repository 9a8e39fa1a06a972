"""KIWI image builds: description checks, build parameters, a content-addressed image cache.

Modules, bottom-up (each imports only the ones above it):

* :mod:`~tasks.kiwi.errors`: the exception tree (:class:`KiwiTaskError` and its subclasses).
* :mod:`~tasks.kiwi.models`: what the parts hand each other (:class:`DescriptionInfo`,
  :class:`BuildOutput`, :class:`ImageRef`, the :class:`Builder` protocol).
* :mod:`~tasks.kiwi.overlay`: the ``root/`` overlay's contract (identity script and unit, the
  ``minion.d`` rules, ``"@KEY@"`` placeholders).
* :mod:`~tasks.kiwi.params`: build parameters (:func:`resolve_params`,
  :func:`render_minion_d`). In a real build ``config.sh`` does the substitution inside the
  image from a ``build-params`` file that :class:`KiwiBuilder` writes into its copy of the
  description; :func:`render_minion_d` is the same substitution in Python.
* :mod:`~tasks.kiwi.inprocess`: KIWI as a library (``XMLDescription``, ``XMLState``, the
  ``RuntimeChecker`` checks ``kiwi-ng system build`` runs), with its temp files moved; the
  repository options a local build of a description made for OBS needs (:func:`local_repo_args`).
* :mod:`~tasks.kiwi.validate`: :func:`resolve_description` and
  :func:`validate_description` (KIWI's checks + ``bash -n`` + the overlay contract, every
  failure collected into one :class:`KiwiDescriptionError`).
* :mod:`~tasks.kiwi.builders`: :class:`LabBuilder` (KIWI validation + an empty qcow2 from
  ``qemu-img``) and :class:`KiwiBuilder` (``kiwi-ng system build``, needs root).
* :mod:`~tasks.kiwi.cache`: :class:`ImageCache`, ``<cache>/<key>/image.qcow2`` +
  ``meta.json`` keyed by :func:`image_key`; a hit does no KIWI work; concurrent misses for one
  key build once.
* :mod:`~tasks.kiwi.task`: the Prefect task :func:`ensure_image` (the only place Prefect is
  used).

Everything public is re-exported here: import from ``tasks.kiwi``, not from the modules.
"""

from __future__ import annotations

from tasks.kiwi.builders import (
    BUILDERS,
    KIWI_BUILD_TIMEOUT,
    KIWI_VERSION,
    LAB_DISK_SIZE,
    QEMU_IMG_TIMEOUT,
    KiwiBuilder,
    LabBuilder,
    make_builder,
)
from tasks.kiwi.cache import ImageCache, file_sha256, image_key
from tasks.kiwi.errors import (
    BuildParamsError,
    KiwiBuildError,
    KiwiBuildTimeout,
    KiwiDescriptionError,
    KiwiTaskError,
)
from tasks.kiwi.inprocess import (
    OBS_REPOSITORIES,
    RUNTIME_CHECKS,
    explain_schema_errors,
    local_repo_args,
)
from tasks.kiwi.models import Builder, BuildOutput, DescriptionInfo, ImageRef, LineSink
from tasks.kiwi.overlay import (
    APPLY_PARAMS_SCRIPT,
    AUTOSIGN_GRAIN,
    BOOTSTRAP_CONF,
    BUILD_PARAMS_FILE,
    FIRSTBOOT_SLS,
    IDENTITY_SCRIPT,
    IDENTITY_UNIT,
    MINION_D,
    PLACEHOLDER_RE,
    REQUIRED_PACKAGES,
)
from tasks.kiwi.params import (
    BUILDER_PARAMS,
    DEFAULT_PARAMS,
    PARAM_KEY_RE,
    PARAM_VALUE_RE,
    render_minion_d,
    resolve_params,
)
from tasks.kiwi.task import ensure_image, image_status
from tasks.kiwi.validate import (
    IMAGE_BUILDS_DIR,
    SAMPLE_VALUE,
    VALIDATE_BASH_TIMEOUT,
    resolve_description,
    validate_description,
)

__all__ = [
    # errors
    "BuildParamsError",
    "KiwiBuildError",
    "KiwiBuildTimeout",
    "KiwiDescriptionError",
    "KiwiTaskError",
    # models
    "BuildOutput",
    "Builder",
    "DescriptionInfo",
    "ImageRef",
    "LineSink",
    # overlay
    "APPLY_PARAMS_SCRIPT",
    "AUTOSIGN_GRAIN",
    "BOOTSTRAP_CONF",
    "BUILD_PARAMS_FILE",
    "FIRSTBOOT_SLS",
    "IDENTITY_SCRIPT",
    "IDENTITY_UNIT",
    "MINION_D",
    "PLACEHOLDER_RE",
    "REQUIRED_PACKAGES",
    # params
    "BUILDER_PARAMS",
    "DEFAULT_PARAMS",
    "PARAM_KEY_RE",
    "PARAM_VALUE_RE",
    "render_minion_d",
    "resolve_params",
    # inprocess
    "OBS_REPOSITORIES",
    "RUNTIME_CHECKS",
    "explain_schema_errors",
    "local_repo_args",
    # validate
    "IMAGE_BUILDS_DIR",
    "SAMPLE_VALUE",
    "VALIDATE_BASH_TIMEOUT",
    "resolve_description",
    "validate_description",
    # builders
    "BUILDERS",
    "KIWI_BUILD_TIMEOUT",
    "KIWI_VERSION",
    "LAB_DISK_SIZE",
    "QEMU_IMG_TIMEOUT",
    "KiwiBuilder",
    "LabBuilder",
    "make_builder",
    # cache
    "ImageCache",
    "file_sha256",
    "image_key",
    # task
    "ensure_image",
    "image_status",
]
