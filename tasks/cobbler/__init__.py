"""Cobbler: the XML-RPC client (`client`), its errors (`errors`), the hypervisor's system
record (`systems`: the record a store's step 2 writes and plan compares, and the install's
power-on stamp in it), and the Blocks and task the pipeline gets it through (`task`). Import
from `tasks.cobbler`."""

from __future__ import annotations

from tasks.cobbler.client import CobblerClient
from tasks.cobbler.errors import (
    CobblerAuthError,
    CobblerError,
    CobblerNotFound,
    CobblerRejected,
    CobblerUnavailable,
)
from tasks.cobbler.systems import (
    SystemSpec,
    power_cycled_at,
    record_fields,
    spec_fields,
    system_changes,
    system_spec,
)
from tasks.cobbler.task import (
    CobblerCredentials,
    cobbler_client,
    disable_hypervisor_netboot,
    forget_install_secrets,
    remove_hypervisor_record,
)

__all__ = [
    "CobblerAuthError",
    "CobblerClient",
    "CobblerCredentials",
    "CobblerError",
    "CobblerNotFound",
    "CobblerRejected",
    "CobblerUnavailable",
    "SystemSpec",
    "cobbler_client",
    "disable_hypervisor_netboot",
    "forget_install_secrets",
    "power_cycled_at",
    "record_fields",
    "remove_hypervisor_record",
    "spec_fields",
    "system_changes",
    "system_spec",
]
