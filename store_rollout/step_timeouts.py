"""How long each waiting step waits: the one place for these defaults.

The flow's parameters, the tasks' own defaults, the CLI's options and the deployments all read
`STEP_TIMEOUTS`, so a rollout started from the UI, the API, a batch or the CLI waits the same.
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, NonNegativeFloat, PositiveFloat


class StepTimeouts(BaseModel):
    """Seconds per wait; each field is also a `store-rollout` flow parameter named `<field>`,
    and its docstring the CLI option's help."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    hypervisor_timeout: PositiveFloat = 1800
    """Seconds step 3 waits for the hypervisor's ready event after the PXE install (power on,
    install, first highstate)."""
    hypervisor_stall_timeout: PositiveFloat = 300
    """Seconds a hypervisor may answer without getting ready before its highstate is applied
    again."""
    firstboot_timeout: PositiveFloat = 1800
    """Seconds step 6 waits for the store VM's firstboot (two reboots and a highstate) to
    finish."""
    vm_stall_timeout: PositiveFloat = 300
    """Seconds without a sign of life from the store VM after which it is reset."""
    vm_contact_timeout: PositiveFloat = 600
    """Seconds step 6 waits for the store VM's minion to contact the master at all (its key or
    any event)."""
    owner_wait_seconds: NonNegativeFloat = 10
    """Seconds to wait while another rollout or rollback of this store runs; then the run fails
    naming that run, having changed nothing."""


STEP_TIMEOUTS: Final = StepTimeouts()
# how long a store host has from its power-on into the install to its ready event before the
# operators hear of it (the `hypervisor_ready_expected_seconds` setting): under step 3's wait
READY_EXPECTED_SECONDS: Final = 1200.0
