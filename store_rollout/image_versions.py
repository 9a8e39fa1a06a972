"""Image versions as data: a version names a KIWI description and build parameters, the settings
list the versions (`image_versions`) and name the chain's (`image_version`), the inventory may
name a store's own (`vm.image_version`). The version's name goes into the build parameters
(IMAGE_VERSION), so it is part of the image key, and the image bakes it into the VM's grain
(contracts.IMAGE_VERSION_GRAIN): the VM says what it runs, nobody trusts the orchestrator's
memory.

Without versions the image is the settings' `image_description` + `image_params`, unversioned,
as before issue 47.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from store_rollout.contracts import IMAGE_VERSION_PARAM, IMAGE_VERSION_RE, UNVERSIONED_IMAGE


class ImageVersion(BaseModel):
    """One entry of `image_versions`: what builds it. Empty description: the settings'
    `image_description`; params are laid over the settings' `image_params`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    params: dict[str, str] = Field(default_factory=dict)
    # a note for people (what the version brings); shown by plan
    notes: str = ""


class ImageVersionError(ValueError):
    """A version named that the settings do not list, or a list that cannot be built."""


class VersionedImages(Protocol):
    """What resolving a version reads of the settings (ImageSettings has it)."""

    image_description: str
    image_params: dict[str, str]
    image_versions: dict[str, ImageVersion]
    image_version: str


def checked_versions(value: dict[str, Any]) -> dict[str, ImageVersion]:
    """The settings' `image_versions`, each name spelled as a version and none setting
    IMAGE_VERSION itself (the name is the version)."""
    checked: dict[str, ImageVersion] = {}
    for name, spec in value.items():
        if not re.fullmatch(IMAGE_VERSION_RE, str(name)):
            raise ValueError(f"image_versions: {name!r} is no version name: lowercase letters, "
                             "digits, '.', '_', '-', at most 32 (e.g. 2026.11 or pos-7.2)")
        version = spec if isinstance(spec, ImageVersion) else ImageVersion.model_validate(spec)
        if IMAGE_VERSION_PARAM in version.params:
            raise ValueError(f"image_versions.{name}.params: {IMAGE_VERSION_PARAM} is the "
                             "version's name, set by it; remove it from the params")
        checked[str(name)] = version
    return checked


def known(images: VersionedImages, version: str, field: str) -> str:
    """`version` if the settings list it ("" stays "": unversioned); else an error naming
    `field` (where the version was asked for) and the versions there are."""
    if version and version not in images.image_versions:
        listed = ", ".join(sorted(images.image_versions)) or "none"
        raise ImageVersionError(f"{field}: image version {version!r} is not in the settings' "
                                f"image_versions (listed: {listed}); add it there or name a "
                                "listed one")
    return version


def store_version(images: VersionedImages, store_version_field: str | None) -> str:
    """The version a store should run: its inventory `vm.image_version`, else the chain's
    `image_version`; "" when neither names one (the unversioned image)."""
    if store_version_field:
        return known(images, store_version_field, "vm.image_version")
    return known(images, images.image_version, "image_version")


def build_of(images: VersionedImages, version: str) -> tuple[str, dict[str, str]]:
    """The KIWI description and build parameters of `version` ("" : the unversioned image, the
    settings' own description and params)."""
    if not version:
        return images.image_description, dict(images.image_params)
    spec = images.image_versions[known(images, version, "image version")]
    return (spec.description or images.image_description,
            {**images.image_params, **spec.params, IMAGE_VERSION_PARAM: version})


def version_of_params(params: dict[str, Any]) -> str:
    """The version an image was built as, from its build parameters (its meta.json's)."""
    return str(params.get(IMAGE_VERSION_PARAM) or UNVERSIONED_IMAGE)
