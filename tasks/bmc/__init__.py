"""Store hosts' BMCs: the protocol every step uses (`client`), IPMI (`ipmi`, ipmitool) and Redfish
(`redfish`, sushy), their errors, the Block the login lives in (`blocks`) and the power-off task
(`task`). Import from `tasks.bmc`."""

from __future__ import annotations

from tasks.bmc.blocks import (
    BmcCredentials,
    bmc_client,
    bmc_credentials,
    bmc_problems,
)
from tasks.bmc.client import Bmc, power_cycle_for_install
from tasks.bmc.errors import BmcAuthFailed, BmcError, BmcRejected, BmcUnreachable
from tasks.bmc.ipmi import IpmiBmc
from tasks.bmc.redfish import RedfishBmc
from tasks.bmc.task import power_off_hypervisor

__all__ = [
    "Bmc",
    "BmcAuthFailed",
    "BmcCredentials",
    "BmcError",
    "BmcRejected",
    "BmcUnreachable",
    "IpmiBmc",
    "RedfishBmc",
    "bmc_client",
    "bmc_credentials",
    "bmc_problems",
    "power_cycle_for_install",
    "power_off_hypervisor",
]
