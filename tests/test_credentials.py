"""Credentials Blocks (Cobbler, ERP, BMC): secrets stay out of reprs, a named Block wins over the
settings, and the settings alone still work (env or lab)."""

from __future__ import annotations

import uuid

import pytest
from pydantic import SecretStr

from store_rollout.inventory import Store, parse_inventory
from store_rollout.settings import SettingsError, load_settings
from tasks.cobbler import BmcCredentials, CobblerCredentials, SystemSpec, bmc_credentials, cobbler_client
from tasks.erp import ErpCredentials, erp_client
from tests.helpers import BASE_ENV

SECRET = f"s3cret-{uuid.uuid4().hex}"


def store(**hypervisor: str) -> Store:
    return parse_inventory({"stores": [{
        "store_id": "0042",
        "hypervisor": {"hostname": "hv-0042.invalid", "mac": "52:54:00:42:00:01", **hypervisor},
        "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
        "erp": {"site_code": "DE-0042"}}]}).stores[0]


def test_secrets_are_not_in_the_repr_or_str_of_blocks_and_clients() -> None:
    cobbler = CobblerCredentials(url="http://cobbler.invalid/", username="admin", password=SECRET)
    erp = ErpCredentials(base_url="http://erp.invalid", token=SECRET)
    bmc = BmcCredentials(username="bmc-admin", password=SECRET)
    spec = SystemSpec(name="hv", hostname="hv", mac="52:54:00:00:00:01", profile="p",
                      power_pass=bmc.password)
    for thing in (cobbler, erp, bmc, cobbler.get_client(), erp.get_client(), spec):
        assert SECRET not in repr(thing) and SECRET not in str(thing), type(thing).__name__
    for block in (cobbler, erp, bmc):
        assert SECRET not in block.model_dump_json()
    # the clients are built from the Block's values
    assert repr(cobbler.get_client()) == "CobblerClient(url='http://cobbler.invalid/', user='admin')"
    assert erp.get_client().base_url == "http://erp.invalid"


def test_every_block_field_has_a_title_and_description() -> None:
    for block in (CobblerCredentials, ErpCredentials, BmcCredentials):
        for name, info in block.model_fields.items():
            assert info.title and info.description, f"{block.__name__}.{name}"
        assert block.get_block_type_slug().endswith("-credentials")


def test_without_a_block_the_clients_come_from_the_settings() -> None:
    settings = load_settings({**BASE_ENV, "STORE_ROLLOUT_ERP_TIMEOUT_SECONDS": "7"})
    cobbler = cobbler_client(settings)
    assert (cobbler.url, cobbler.user) == ("http://cobbler.invalid/cobbler_api", "u")
    erp = erp_client(settings)
    assert erp.base_url == "http://erp.invalid" and erp.timeout == (3.05, 7.0)


def test_service_fields_are_required_unless_a_block_is_named() -> None:
    bare = {k: v for k, v in BASE_ENV.items() if "COBBLER" not in k and "ERP" not in k}
    with pytest.raises(SettingsError) as err:
        load_settings(bare)
    for field in ("cobbler_url", "cobbler_user", "cobbler_password", "erp_url", "erp_token"):
        assert f"{field}: Field required (set STORE_ROLLOUT_{field.upper()}" in str(err.value)
    assert "or name a Credentials Block with STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK" in str(err.value)
    settings = load_settings({**bare, "STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK": "cobbler-prod",
                              "STORE_ROLLOUT_ERP_CREDENTIALS_BLOCK": "erp-prod"})
    assert settings.cobbler_credentials_block == "cobbler-prod" and settings.cobbler_url == ""
    assert "**" in settings.public()["cobbler_password"]


def test_bmc_login_from_inventory_else_settings() -> None:
    settings = load_settings({**BASE_ENV, "STORE_ROLLOUT_POWER_USER": "env-user",
                              "STORE_ROLLOUT_POWER_PASSWORD": SECRET})
    from_env = bmc_credentials(store(), settings)
    assert from_env.username == "env-user" and from_env.password == SecretStr(SECRET)
    own = bmc_credentials(store(power_user="hv-user", power_password="hv-pass"), settings)
    assert own.username == "hv-user" and own.password.get_secret_value() == "hv-pass"
    assert bmc_credentials(store(), load_settings(BASE_ENV)).missing() == ["user", "password"]


def test_named_blocks_win_over_the_settings(prefect_harness: None) -> None:
    suffix = uuid.uuid4().hex[:8]
    CobblerCredentials(url="http://cobbler-block.invalid/", username="block-user",
                       password=SECRET).save(f"cobbler-{suffix}")
    ErpCredentials(base_url="http://erp-block.invalid/", token=SECRET,
                   timeout_seconds=4).save(f"erp-{suffix}")
    BmcCredentials(username="block-bmc", password=SECRET).save(f"bmc-{suffix}")
    settings = load_settings({**BASE_ENV, "STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK": f"cobbler-{suffix}",
                              "STORE_ROLLOUT_ERP_CREDENTIALS_BLOCK": f"erp-{suffix}",
                              "STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK": f"bmc-{suffix}",
                              "STORE_ROLLOUT_POWER_USER": "env-user"})
    cobbler = cobbler_client(settings)
    assert (cobbler.url, cobbler.user) == ("http://cobbler-block.invalid/", "block-user")
    assert SECRET not in repr(cobbler)
    erp = erp_client(settings)
    assert erp.base_url == "http://erp-block.invalid" and erp.timeout == (3.05, 4.0)
    bmc = bmc_credentials(store(), settings)
    assert bmc.username == "block-bmc" and bmc.password.get_secret_value() == SECRET
    # a store's own login in the inventory still wins over the Block
    assert bmc_credentials(store(power_user="hv-user"), settings).username == "hv-user"


def test_a_missing_block_is_named(prefect_harness: None) -> None:
    settings = load_settings({**BASE_ENV, "STORE_ROLLOUT_ERP_CREDENTIALS_BLOCK": "no-such-erp"})
    with pytest.raises(ValueError, match="no ERP Credentials Block named 'no-such-erp'"):
        erp_client(settings)
