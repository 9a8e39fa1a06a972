"""Credentials Blocks (Cobbler, ERP, BMC): secrets stay out of reprs, a named Block wins over the
settings, the settings alone still work for Cobbler and the ERP (env or lab), and a BMC login
lives in a Block only (the fleet's, or a store's own)."""

from __future__ import annotations

import uuid

import pytest
from prefect.blocks.system import Secret
from pydantic import SecretStr

from store_rollout.inventory import InventoryError, Store, parse_inventory
from store_rollout.settings import SettingsError, load_settings
from tasks.bmc import BmcCredentials, IpmiBmc, RedfishBmc, bmc_credentials, bmc_problems
from tasks.cobbler import CobblerCredentials, cobbler_client
from tasks.erp import ErpCredentials, erp_client
from tests.helpers import BASE_ENV

SECRET = f"s3cret-{uuid.uuid4().hex}"


def store(**hypervisor: object) -> Store:
    return parse_inventory({"stores": [{
        "store_id": "0042",
        "hypervisor": {"hostname": "hv-0042.invalid", "mac": "52:54:00:42:00:01", **hypervisor},
        "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
        "erp": {"site_code": "DE-0042"}}]}).stores[0]


def test_secrets_are_not_in_the_repr_or_str_of_blocks_and_clients() -> None:
    cobbler = CobblerCredentials(url="https://cobbler.invalid/", username="admin", password=SECRET)
    erp = ErpCredentials(base_url="https://erp.invalid", token=SECRET)
    bmc = BmcCredentials(username="bmc-admin", password=SECRET)
    ipmi = bmc.get_client(store(power_address="10.0.0.9"), "ipmi")
    redfish = bmc.get_client(store(power_address="bmc.invalid"), "redfish")
    for thing in (cobbler, erp, bmc, cobbler.get_client(), erp.get_client(), ipmi, redfish):
        assert SECRET not in repr(thing) and SECRET not in str(thing), type(thing).__name__
    for block in (cobbler, erp, bmc):
        assert SECRET not in block.model_dump_json()
    # the clients are built from the Block's values
    assert repr(cobbler.get_client()) == "CobblerClient(url='https://cobbler.invalid/', user='admin')"
    assert erp.get_client().base_url == "https://erp.invalid"


def test_every_block_field_has_a_title_and_description() -> None:
    for block in (CobblerCredentials, ErpCredentials, BmcCredentials):
        for name, info in block.model_fields.items():
            assert info.title and info.description, f"{block.__name__}.{name}"
        assert block.get_block_type_slug().endswith("-credentials")


def test_without_a_block_the_clients_come_from_the_settings(prefect_harness: None) -> None:
    for name in ("cobbler-password", "erp-token"):  # the secrets: Secret blocks they name
        Secret(value=SECRET).save(name, overwrite=True)
    settings = load_settings({**BASE_ENV, "STORE_ROLLOUT_ERP_TIMEOUT_SECONDS": "7"})
    cobbler = cobbler_client(settings)
    assert (cobbler.url, cobbler.user) == ("https://cobbler.invalid/cobbler_api", "u")
    assert cobbler._password.get_secret_value() == SECRET
    erp = erp_client(settings)
    assert erp.base_url == "https://erp.invalid" and erp.timeout == (3.05, 7.0)


def test_service_fields_are_required_unless_a_block_is_named() -> None:
    bare = {k: v for k, v in BASE_ENV.items() if "COBBLER" not in k and "ERP" not in k}
    with pytest.raises(SettingsError) as err:
        load_settings(bare)
    for field in ("cobbler_url", "cobbler_user", "cobbler_password_block", "erp_url",
                  "erp_token_block"):
        assert f"{field}: Field required (set STORE_ROLLOUT_{field.upper()}" in str(err.value)
    assert "or name a Credentials Block with STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK" in str(err.value)
    settings = load_settings({**bare, "STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK": "cobbler-prod",
                              "STORE_ROLLOUT_ERP_CREDENTIALS_BLOCK": "erp-prod"})
    assert settings.cobbler_credentials_block == "cobbler-prod" and settings.cobbler_url == ""
    assert not {"cobbler_password", "erp_token"} & set(settings.public())  # no secret is a setting


def test_the_bmc_client_follows_the_inventory() -> None:
    bmc = BmcCredentials(username="bmc-admin", password=SECRET, timeout=7)
    ipmi = bmc.get_client(store(power_address="10.0.0.9", power_port=6230), "ipmi")
    assert isinstance(ipmi, IpmiBmc) and (ipmi.address, ipmi.port, ipmi.timeout) == ("10.0.0.9", 6230, 7)
    assert isinstance(bmc.get_client(store(power_address="10.0.0.9"), "ipmi"), IpmiBmc)
    assert bmc.get_client(store(power_address="10.0.0.9"), "ipmi").port == 623  # type: ignore[attr-defined]
    redfish = bmc.get_client(store(power_address="bmc-42.invalid", redfish_system_id="1"),
                             "redfish")
    assert isinstance(redfish, RedfishBmc)
    assert (redfish.url, redfish.system_id) == ("https://bmc-42.invalid", "1")
    lab = bmc.get_client(store(power_address="http://127.0.0.1:8000", power_port=1), "redfish")
    assert lab.url == "http://127.0.0.1:8000"  # type: ignore[attr-defined]  # a URL keeps its port
    assert ipmi.label == "store 0042: IPMI BMC 10.0.0.9:6230"


def test_the_inventory_refuses_a_bmc_login_naming_the_block_to_use() -> None:
    for given in ({"power_password": SECRET}, {"power_user": "admin"}):
        with pytest.raises(InventoryError) as err:
            store(**given)
        assert "hypervisor.bmc_credentials_block" in str(err.value)
        assert SECRET not in str(err.value)


def test_retired_bmc_settings_are_refused_naming_the_block() -> None:
    for name in ("STORE_ROLLOUT_POWER_PASSWORD", "STORE_ROLLOUT_POWER_USER",
                 "STORE_ROLLOUT_POWER_ADDRESS"):
        with pytest.raises(SettingsError) as err:
            load_settings({**BASE_ENV, name: SECRET})
        assert name in str(err.value) and "BMC Credentials Block" in str(err.value)
        assert SECRET not in str(err.value)


def test_preflight_names_a_store_without_bmc_address_or_block() -> None:
    problems = bmc_problems([store()], load_settings(BASE_ENV))
    assert problems == [
        "store '0042': hypervisor.power_address: no BMC address (step 2 powers the host through "
        "its BMC): add it (IPMI: host or IP; Redfish: https://host)",
        "store '0042': no BMC Credentials Block named: set STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK, "
        "or hypervisor.bmc_credentials_block for this store"]


def test_named_blocks_win_over_the_settings(prefect_harness: None) -> None:
    suffix = uuid.uuid4().hex[:8]
    CobblerCredentials(url="https://cobbler-block.invalid/", username="block-user",
                       password=SECRET).save(f"cobbler-{suffix}")
    ErpCredentials(base_url="https://erp-block.invalid/", token=SECRET,
                   timeout_seconds=4).save(f"erp-{suffix}")
    BmcCredentials(username="block-bmc", password=SECRET).save(f"bmc-{suffix}")
    BmcCredentials(username="own-bmc", password=SECRET).save(f"own-{suffix}")
    BmcCredentials(username="", password=SecretStr("")).save(f"empty-{suffix}")
    settings = load_settings({**BASE_ENV, "STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK": f"cobbler-{suffix}",
                              "STORE_ROLLOUT_ERP_CREDENTIALS_BLOCK": f"erp-{suffix}",
                              "STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK": f"bmc-{suffix}"})
    cobbler = cobbler_client(settings)
    assert (cobbler.url, cobbler.user) == ("https://cobbler-block.invalid/", "block-user")
    assert SECRET not in repr(cobbler)
    erp = erp_client(settings)
    assert erp.base_url == "https://erp-block.invalid" and erp.timeout == (3.05, 4.0)
    bmc = bmc_credentials(store(), settings)
    assert bmc.username == "block-bmc" and bmc.password.get_secret_value() == SECRET
    # a store's own Block wins over the fleet's
    assert bmc_credentials(store(bmc_credentials_block=f"own-{suffix}"), settings).username == \
        "own-bmc"
    # preflight: each Block read once, a missing or empty one named with the store
    stores = [store(power_address="10.0.0.1", bmc_credentials_block=name)
              for name in (f"no-such-{suffix}", f"empty-{suffix}")]
    problems = bmc_problems(stores, settings)
    assert len(problems) == 2, problems
    assert f"no BMC Credentials Block named 'no-such-{suffix}'" in problems[0]
    assert problems[1] == (f"store '0042': the BMC Credentials Block 'empty-{suffix}' has no "
                           "user and password: set it in the Prefect UI")
    # SECRET is longer than the 20 bytes IPMI 2.0 takes: fine for Redfish, refused for IPMI
    assert bmc_problems([store(power_address="10.0.0.1", power_type="redfish")], settings) == []
    assert bmc_problems([store(power_address="10.0.0.1")], settings) == [
        f"store '0042': the BMC Credentials Block 'bmc-{suffix}' holds a password longer than "
        "IPMI 2.0's 20 bytes: this host's BMC (IPMI) cannot take it"]


def test_a_missing_block_is_named(prefect_harness: None) -> None:
    settings = load_settings({**BASE_ENV, "STORE_ROLLOUT_ERP_CREDENTIALS_BLOCK": "no-such-erp"})
    with pytest.raises(ValueError, match="no ERP Credentials Block named 'no-such-erp'"):
        erp_client(settings)
