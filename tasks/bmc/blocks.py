"""Where step 2 gets a store host's BMC: the `BmcCredentials` Prefect Block (the login, the only
place it lives) builds the client for the protocol and address the inventory names."""

from __future__ import annotations

from prefect.blocks.abstract import CredentialsBlock
from pydantic import Field, SecretStr

from store_rollout.inventory import Store
from store_rollout.settings_parts import BmcSettings
from tasks.blocks import load_block
from tasks.bmc.client import Bmc
from tasks.bmc.ipmi import IPMI_PASSWORD_MAX_BYTES, IPMI_PORT, IpmiBmc
from tasks.bmc.redfish import RedfishBmc
from tasks.transport import outside_url


class BmcCredentials(CredentialsBlock):
    """Login to store hosts' BMCs (IPMI or Redfish), named fleet-wide by
    `STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK` or per store by `hypervisor.bmc_credentials_block`."""

    _block_type_name = "BMC Credentials"

    username: str = Field(title="Username", description="BMC login.")
    password: SecretStr = Field(title="Password", description="BMC password; never logged.")
    timeout: float = Field(default=20.0, gt=0, le=300, title="Timeout",
                           description="Seconds one BMC call may take.")
    verify_tls: bool = Field(default=True, title="Verify TLS",
                             description="Check a Redfish BMC's certificate (off only for a BMC "
                                         "with its factory self-signed one).")

    def missing(self) -> list[str]:
        """Which of user and password are empty (preflight refuses a store without both)."""
        return [n for n, v in (("user", self.username), ("password", self.password.get_secret_value()))
                if not v]

    def get_client(self, store: Store, power_type: str, insecure_http: bool = False,
                   ca_bundle: str = "") -> Bmc:
        """The client for the store's BMC (`power_type`: the store's, else the settings';
        `insecure_http`, `ca_bundle`: the settings' insecure_redfish_http, redfish_ca_bundle)."""
        hv = store.hypervisor
        address = hv.power_address or ""
        if power_type == "redfish":
            url = address if "://" in address else f"https://{address}"
            if hv.power_port and "://" not in address:
                url = f"{url}:{hv.power_port}"
            return RedfishBmc(url, self.username, self.password, system_id=hv.redfish_system_id,
                              timeout=self.timeout,
                              verify=(ca_bundle or True) if self.verify_tls else False,
                              store_id=store.store_id, insecure_http=insecure_http)
        return IpmiBmc(address, self.username, self.password, port=hv.power_port or IPMI_PORT,
                       timeout=self.timeout, store_id=store.store_id,
                       cipher_suite=hv.ipmi_cipher_suite)


def bmc_credentials_block_name(store: Store, settings: BmcSettings) -> str:
    """The store's own Block, else the fleet's ("" when neither is named)."""
    return store.hypervisor.bmc_credentials_block or settings.bmc_credentials_block


def bmc_credentials(store: Store, settings: BmcSettings) -> BmcCredentials:
    name = bmc_credentials_block_name(store, settings)
    if not name:
        raise ValueError(f"store {store.store_id}: no BMC Credentials Block named: set "
                         "STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK, or hypervisor.bmc_credentials_block "
                         "for this store")
    return load_block(BmcCredentials, name)


def power_type_of(store: Store, settings: BmcSettings) -> str:
    return store.hypervisor.power_type or settings.power_type


def bmc_client(store: Store, settings: BmcSettings) -> Bmc:
    """The store host's BMC, over its protocol, with the login from its Block."""
    client = bmc_credentials(store, settings).get_client(
        store, power_type_of(store, settings), settings.insecure_redfish_http,
        settings.redfish_ca_bundle)
    if isinstance(client, RedfishBmc):  # the warning when plain HTTP is let through
        outside_url(client.url, "redfish", f"store {store.store_id}: hypervisor.power_address",
                    settings.insecure_redfish_http)
    return client


def bmc_problems(stores: list[Store], settings: BmcSettings) -> list[str]:
    """What keeps step 2 from reaching each store's BMC, found without calling it: no address,
    no Block named, a Block missing or without a login (each Block is read once)."""
    problems: list[str] = []
    blocks: dict[str, BmcCredentials | str] = {}
    for store in stores:
        where = f"store {store.store_id!r}"
        if not store.hypervisor.power_address:
            problems.append(f"{where}: hypervisor.power_address: no BMC address (step 2 powers "
                            "the host through its BMC): add it (IPMI: host or IP; Redfish: "
                            "https://host)")
        name = bmc_credentials_block_name(store, settings)
        if not name:
            problems.append(f"{where}: no BMC Credentials Block named: set "
                            "STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK, or hypervisor."
                            "bmc_credentials_block for this store")
            continue
        if name not in blocks:
            try:
                blocks[name] = load_block(BmcCredentials, name)
            except ValueError as exc:
                blocks[name] = str(exc)
        block = blocks[name]
        if isinstance(block, str):
            problems.append(f"{where}: {block}")
        elif block.missing():
            problems.append(f"{where}: the BMC Credentials Block {name!r} has no "
                            f"{' and '.join(block.missing())}: set it in the Prefect UI")
        elif (power_type_of(store, settings) == "ipmi"
              and len(block.password.get_secret_value().encode()) > IPMI_PASSWORD_MAX_BYTES):
            problems.append(f"{where}: the BMC Credentials Block {name!r} holds a password "
                            f"longer than IPMI 2.0's {IPMI_PASSWORD_MAX_BYTES} bytes: this "
                            "host's BMC (IPMI) cannot take it")
    return problems
