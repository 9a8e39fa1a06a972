"""Image versions as data (store_rollout/image_versions.py): which version a store should run,
what builds it, and the errors a person sees for a version nobody listed."""

from __future__ import annotations

import pytest

from store_rollout.contracts import IMAGE_VERSION_PARAM, UNVERSIONED_IMAGE
from store_rollout.image_versions import (
    ImageVersionError,
    build_of,
    store_version,
    version_of_params,
)
from store_rollout.settings import SettingsError, load_settings
from store_rollout.settings_parts import ImageSettings

BASE = {"STORE_ROLLOUT_SALT_MASTER_CONFIG": "/dev/null",
        "STORE_ROLLOUT_SALT_MASTER_ADDRESS": "127.0.0.1",
        "STORE_ROLLOUT_COBBLER_URL": "https://c.invalid/", "STORE_ROLLOUT_COBBLER_USER": "u",
        "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK": "p", "STORE_ROLLOUT_ERP_URL": "https://e.invalid",
        "STORE_ROLLOUT_ERP_TOKEN_BLOCK": "t", "STORE_ROLLOUT_IMAGE_BASE_URL": "https://i.invalid",
        "STORE_ROLLOUT_IMAGE_PARAMS": '{"SALT_MASTER": "10.0.0.1"}',
        "STORE_ROLLOUT_IMAGE_VERSIONS":
            '{"v1": {}, "v2": {"params": {"POS_RELEASE": "7.2"}, "notes": "POS 7.2"},'
            ' "lab": {"description": "lab-debian"}}',
        "STORE_ROLLOUT_IMAGE_VERSION": "v1"}


def images(**env: str) -> ImageSettings:
    return ImageSettings.of(load_settings({**BASE, **env}))


def test_a_store_runs_its_own_version_else_the_chains() -> None:
    chain = images()
    assert store_version(chain, None) == "v1"
    assert store_version(chain, "v2") == "v2"
    assert store_version(images(STORE_ROLLOUT_IMAGE_VERSION=""), None) == ""


def test_a_version_builds_from_its_description_and_params_with_its_name_in_them() -> None:
    chain = images()
    assert build_of(chain, "v2") == ("leap16-jeos", {"SALT_MASTER": "10.0.0.1",
                                                     "POS_RELEASE": "7.2",
                                                     IMAGE_VERSION_PARAM: "v2"})
    assert build_of(chain, "lab")[0] == "lab-debian"
    # unversioned: the settings' own description and params, as before versions existed
    assert build_of(chain, "") == ("leap16-jeos", {"SALT_MASTER": "10.0.0.1"})


def test_an_unlisted_version_is_refused_naming_the_field_and_the_listed_ones() -> None:
    with pytest.raises(ImageVersionError, match=r"vm.image_version: image version 'v9' is not "
                       r"in the settings' image_versions \(listed: lab, v1, v2\)"):
        store_version(images(), "v9")
    with pytest.raises(SettingsError, match="image_version: image version 'v3' is not"):
        load_settings({**BASE, "STORE_ROLLOUT_IMAGE_VERSION": "v3"})


@pytest.mark.parametrize(("versions", "said"), [
    ('{"V 2": {}}', "'V 2' is no version name"),
    ('{"v2": {"params": {"IMAGE_VERSION": "v3"}}}', "IMAGE_VERSION is the version's name"),
    ('{"v2": {"paramz": {}}}', "paramz"),
])
def test_a_malformed_version_list_is_refused(versions: str, said: str) -> None:
    with pytest.raises(SettingsError, match=said):
        load_settings({**BASE, "STORE_ROLLOUT_IMAGE_VERSIONS": versions,
                       "STORE_ROLLOUT_IMAGE_VERSION": ""})


def test_what_an_image_says_it_is() -> None:
    assert version_of_params({IMAGE_VERSION_PARAM: "v2", "SALT_MASTER": "x"}) == "v2"
    assert version_of_params({"SALT_MASTER": "x"}) == UNVERSIONED_IMAGE
