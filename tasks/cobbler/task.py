"""Where tasks get Cobbler: the `CobblerCredentials` and `BmcCredentials` Prefect Blocks,
`cobbler_client()` and `bmc_credentials()` (a named Block, else the settings), and the rollback's
netboot-off task."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.blocks.abstract import CredentialsBlock
from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from store_rollout.inventory import Store
from store_rollout.settings import RolloutSettings, load_settings
from tasks.blocks import load_block
from tasks.cobbler.client import DEFAULT_TIMEOUT, CobblerClient
from tasks.cobbler.errors import CobblerUnavailable
from tasks.retry import retry_on


class CobblerCredentials(CredentialsBlock):
    """Login to Cobbler's XML-RPC API (`STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK=<name>`)."""

    _block_type_name = "Cobbler Credentials"

    url: str = Field(title="URL", description="Cobbler XML-RPC URL, e.g. http://cobbler/cobbler_api")
    username: str = Field(title="Username", description="Cobbler API user.")
    password: SecretStr = Field(title="Password", description="Cobbler API password; never logged.")
    timeout: float = Field(default=DEFAULT_TIMEOUT, gt=0, title="Timeout",
                           description="Seconds one XML-RPC call may take.")
    allow_default_credentials: bool = Field(
        default=False, title="Allow default credentials",
        description="Accept cobbler/cobbler (a throwaway Cobbler only).")

    def get_client(self) -> CobblerClient:
        return CobblerClient(url=self.url, user=self.username, password=self.password,
                             timeout=self.timeout,
                             allow_default_credentials=self.allow_default_credentials)


class BmcCredentials(Block):
    """BMC login Cobbler's fence agent uses to power-cycle a hypervisor
    (`STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK=<name>`). Not a CredentialsBlock: the project talks to
    no BMC itself, Cobbler does; the password is unwrapped only by `CobblerClient.upsert_system`."""

    _block_type_name = "BMC Credentials"

    username: str = Field(title="Username", description="BMC login (Cobbler's power_user).")
    password: SecretStr = Field(title="Password",
                                description="BMC password (Cobbler's power_pass); never logged.")

    def missing(self) -> list[str]:
        """Which of user and password are empty (preflight refuses a store without both)."""
        return [n for n, v in (("user", self.username), ("password", self.password.get_secret_value()))
                if not v]


def cobbler_client(settings: RolloutSettings | None = None) -> CobblerClient:
    """The Cobbler client every task uses: from the Block STORE_ROLLOUT_COBBLER_CREDENTIALS_BLOCK
    names, else from the cobbler_* settings (env or lab)."""
    settings = settings or load_settings()
    if settings.cobbler_credentials_block:
        return load_block(CobblerCredentials, settings.cobbler_credentials_block).get_client()
    return CobblerCredentials(
        url=settings.cobbler_url, username=settings.cobbler_user, password=settings.cobbler_password,
        allow_default_credentials=settings.cobbler_allow_default_credentials).get_client()


def bmc_credentials(store: Store, settings: RolloutSettings) -> BmcCredentials:
    """The BMC login of a store's hypervisor: its inventory entry's, else the Block
    STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK names, else the power_user/power_password settings."""
    hv = store.hypervisor
    base = (load_block(BmcCredentials, settings.bmc_credentials_block) if settings.bmc_credentials_block
            else BmcCredentials(username=settings.power_user, password=settings.power_password))
    return BmcCredentials(username=hv.power_user or base.username,
                          password=hv.power_password or base.password)


@task(name="disable_hypervisor_netboot", task_run_name="disable-netboot-{store.store_id}",
      retries=4, retry_delay_seconds=[2, 4, 8, 16], retry_condition_fn=retry_on(CobblerUnavailable))
def disable_hypervisor_netboot(store: Store) -> dict[str, Any]:
    """Rollback: keep the Cobbler record (the hardware is still there) but turn netboot off, so a
    power cycle boots the installed system instead of reinstalling it."""
    client = cobbler_client()
    system = store.cobbler_system
    exists = client.get_system(system) is not None
    if exists:
        client.disable_netboot(system)
    get_run_logger().info("store %s: Cobbler system %s netboot off (exists: %s)",
                          store.store_id, system, exists)
    return {"system": system, "exists": exists, "netboot": False}
