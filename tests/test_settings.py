"""Settings from the environment: a missing or wrong value is named with where to set it."""

from __future__ import annotations

import pytest

from store_rollout.settings import SettingsError, load_settings

BASE = {"STORE_ROLLOUT_COBBLER_URL": "http://cobbler/", "STORE_ROLLOUT_COBBLER_USER": "u",
        "STORE_ROLLOUT_COBBLER_PASSWORD": "p", "STORE_ROLLOUT_SALT_MASTER_CONFIG": "/etc/salt/master",
        "STORE_ROLLOUT_SALT_MASTER_ADDRESS": "salt", "STORE_ROLLOUT_ERP_URL": "http://erp/",
        "STORE_ROLLOUT_ERP_TOKEN": "t"}


def test_image_base_url_is_required_and_named() -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(dict(BASE))
    assert "image_base_url: Field required (set STORE_ROLLOUT_IMAGE_BASE_URL" in str(err.value)


def test_image_base_url_must_be_http() -> None:
    with pytest.raises(SettingsError, match="image_base_url: .*'file:///var/cache/images' is not "
                                            "an http.s. URL"):
        load_settings({**BASE, "STORE_ROLLOUT_IMAGE_BASE_URL": "file:///var/cache/images"})
    settings = load_settings({**BASE, "STORE_ROLLOUT_IMAGE_BASE_URL": "https://images.example/s/",
                              "STORE_ROLLOUT_IMAGE_RATE_LIMIT": "2000000"})
    assert settings.image_base_url == "https://images.example/s"
    assert settings.image_rate_limit == 2_000_000 and settings.image_ca_bundle == ""
