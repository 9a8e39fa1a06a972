"""Where tasks get Cobbler: the `CobblerCredentials` Prefect Block, `cobbler_client()` (a named
Block, else the settings), the rollback's netboot-off task and the decommission's removal."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.blocks.abstract import CredentialsBlock
from pydantic import Field, SecretStr

from store_rollout.contracts import INSTALL_SECRETS_META
from store_rollout.inventory import Store
from store_rollout.settings_parts import CobblerSettings
from tasks.blocks import load_block, secret_of
from tasks.cobbler.client import DEFAULT_TIMEOUT, CobblerClient
from tasks.cobbler.errors import CobblerUnavailable
from tasks.retry import COBBLER_RETRY
from tasks.slots import fleet_slot
from tasks.transport import outside_url


class CobblerCredentials(CredentialsBlock):
    """Login to Cobbler's XML-RPC API (`STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK=<name>`)."""

    _block_type_name = "Cobbler Credentials"

    url: str = Field(title="URL", description="Cobbler XML-RPC URL, e.g. https://cobbler/cobbler_api")
    username: str = Field(title="Username", description="Cobbler API user.")
    password: SecretStr = Field(title="Password", description="Cobbler API password; never logged.")
    timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0, title="Timeout",
                           description="Seconds one XML-RPC call may take.")
    allow_default_credentials: bool = Field(
        default=False, title="Allow default credentials",
        description="Accept cobbler/cobbler (a throwaway Cobbler only).")

    def get_client(self, insecure_http: bool = False, ca_bundle: str = "") -> CobblerClient:
        """`insecure_http`, `ca_bundle`: the settings' insecure_cobbler_http, cobbler_ca_bundle."""
        return CobblerClient(url=self.url, user=self.username, password=self.password,
                             timeout=self.timeout,
                             allow_default_credentials=self.allow_default_credentials,
                             insecure_http=insecure_http, ca_bundle=ca_bundle)


def cobbler_client(settings: CobblerSettings) -> CobblerClient:
    """The Cobbler client every task uses: from the Block STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK
    names, else from the cobbler_* settings and the Secret block
    STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK names (the password is never a setting)."""
    if settings.cobbler_credentials_block:
        credentials = load_block(CobblerCredentials, settings.cobbler_credentials_block)
        field = f"the url of the Cobbler Credentials Block {settings.cobbler_credentials_block!r}"
    else:
        credentials = CobblerCredentials(
            url=settings.cobbler_url, username=settings.cobbler_user,
            password=secret_of(settings.cobbler_password_block,
                               "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK"),
            allow_default_credentials=settings.cobbler_allow_default_credentials)
        field = "STORE_ROLLOUT_COBBLER_URL"
    outside_url(credentials.url, "cobbler", field, settings.insecure_cobbler_http)
    return credentials.get_client(settings.insecure_cobbler_http, settings.cobbler_ca_bundle)


def forget_install_secrets(store: Store, client: CobblerClient) -> list[str]:
    """An installed host's record without its one-time autosign token and its root password's
    hash (INSTALL_SECRETS_META): Cobbler serves a record's profile to anyone asking by name,
    and the host needs neither any more. Returns the keys removed ([] on a rerun)."""
    return client.forget_meta(store.cobbler_system, INSTALL_SECRETS_META)


@task(name="disable_hypervisor_netboot", task_run_name="disable-netboot-{store.store_id}",
      **COBBLER_RETRY.on(CobblerUnavailable))
def disable_hypervisor_netboot(store: Store, cobbler: CobblerSettings) -> dict[str, Any]:
    """Rollback: keep the Cobbler record (the hardware is still there) but turn netboot off, so a
    power cycle boots the installed system instead of reinstalling it."""
    client = cobbler_client(cobbler)
    system = store.cobbler_system
    exists = client.get_system(system) is not None
    if exists:
        client.disable_netboot(system)
    get_run_logger().info("store %s: Cobbler system %s netboot off (exists: %s)",
                          store.store_id, system, exists)
    return {"system": system, "exists": exists, "netboot": False}


@task(name="remove_hypervisor_record", task_run_name="remove-cobbler-record-{store.store_id}",
      **COBBLER_RETRY.on(CobblerUnavailable))
def remove_hypervisor_record(store: Store, cobbler: CobblerSettings) -> dict[str, Any]:
    """Decommission: the host's Cobbler system removed (its PXE files with it) and its MAC out
    of the DHCP configuration, under the fleet's one-sync-at-a-time slot."""
    client = cobbler_client(cobbler)
    with fleet_slot(cobbler.cobbler_sync_limit):
        removed = client.remove_system(store.cobbler_system)
        client.sync_dhcp()
    get_run_logger().info("store %s: Cobbler system %s removed: %s; DHCP configuration rewritten",
                          store.store_id, store.cobbler_system, removed)
    return {"system": store.cobbler_system, "removed": removed}
