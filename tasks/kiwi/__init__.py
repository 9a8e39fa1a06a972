"""KIWI image builds: description checks, build parameters, a content-addressed image cache.

Modules, bottom-up (each imports only the ones above it):

* :mod:`~tasks.kiwi.errors`: the exception tree (:class:`KiwiTaskError` and its subclasses).
* :mod:`~tasks.kiwi.models`: what the parts hand each other (:class:`DescriptionInfo`,
  :class:`BuildOutput`, :class:`ImageRef`, the :class:`Builder` protocol).
* :mod:`~tasks.kiwi.overlay`: the ``root/`` overlay's contract (identity script and unit, the
  ``minion.d`` rules, ``"@KEY@"`` placeholders).
* :mod:`~tasks.kiwi.params`: build parameters (:func:`resolve_params`). In a real build
  ``config.sh`` does the substitution (:func:`~tasks.kiwi.overlay.substitute` in Python) inside
  the image from a ``build-params`` file that :class:`KiwiBuilder` writes into its copy of the
  description.
* :mod:`~tasks.kiwi.inprocess`: KIWI as a library (``XMLDescription``, ``XMLState``, the
  ``RuntimeChecker`` checks ``kiwi-ng system build`` runs), with its temp files moved; the
  repository options a local build of a description made for OBS needs (:func:`local_repo_args`).
* :mod:`~tasks.kiwi.validate`: :func:`resolve_description` and
  :func:`validate_description` (KIWI's checks + ``bash -n`` + the overlay contract, every
  failure collected into one :class:`KiwiDescriptionError`).
* :mod:`~tasks.kiwi.kiwi_ng`: :class:`KiwiBuilder` (``kiwi-ng system build``, needs root).
* :mod:`~tasks.kiwi.builders`: :func:`make_builder`, which picks a builder by name: ``kiwi``
  or one another install registers (:mod:`store_rollout.plugins`).
* :mod:`~tasks.kiwi.cache`: :class:`ImageCache`, ``<cache>/<key>/image.qcow2`` +
  ``meta.json`` keyed by :func:`image_key`; a hit does no KIWI work; concurrent misses for one
  key build once.
* :mod:`~tasks.kiwi.task`: the Prefect task :func:`ensure_image` (the only place Prefect is
  used).

What other packages use is exported here (``__all__``, pinned by
tests/structure/test_public_surface.py): import it from ``tasks.kiwi``; the rest belongs to the
modules.
"""

from __future__ import annotations

from tasks.kiwi.builders import make_builder
from tasks.kiwi.cache import ImageCache, image_key
from tasks.kiwi.errors import (
    BuildParamsError,
    KiwiBuildError,
    KiwiBuildTimeout,
    KiwiDescriptionError,
)
from tasks.kiwi.inprocess import OBS_REPOSITORIES, local_repo_args
from tasks.kiwi.kiwi_ng import KiwiBuilder
from tasks.kiwi.models import BuildOutput
from tasks.kiwi.overlay import BUILD_PARAMS_FILE, IDENTITY_SCRIPT, minion_d_dir, substitute
from tasks.kiwi.params import kiwi_profile, resolve_params
from tasks.kiwi.task import ensure_image, image_status
from tasks.kiwi.validate import IMAGE_BUILDS_DIR, resolve_description, validate_description

__all__ = [
    "BUILD_PARAMS_FILE",
    "IDENTITY_SCRIPT",
    "IMAGE_BUILDS_DIR",
    "OBS_REPOSITORIES",
    "BuildOutput",
    "BuildParamsError",
    "ImageCache",
    "KiwiBuildError",
    "KiwiBuildTimeout",
    "KiwiBuilder",
    "KiwiDescriptionError",
    "ensure_image",
    "image_key",
    "image_status",
    "kiwi_profile",
    "local_repo_args",
    "make_builder",
    "minion_d_dir",
    "resolve_description",
    "resolve_params",
    "substitute",
    "validate_description",
]
