"""Hardware refresh (issue 48): the hypervisors' libvirt TLS trust and the move of a store VM to
its new box. Part of the settings (store_rollout/settings.py)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from store_rollout.settings_parts import _Part


class RefreshSettings(BaseSettings):
    # the master's libvirt CA (tasks/libvirt_tls.py): kept on the master, 0700; empty refuses a
    # refresh (fail closed: no CA is made up somewhere unnamed)
    libvirt_ca_dir: str = Field("", description="directory on the master holding the "
                                "hypervisors' libvirt TLS CA (made on first use, mode 0700)")
    libvirt_cert_days: int = Field(825, ge=1, le=3650,
                                   description="validity of a hypervisor's libvirt certificate")
    refresh_move_timeout_seconds: float = Field(
        1800, gt=0, description="longest a store VM's move to its new box may take")


class RefreshPart(_Part):
    """What a refresh's tasks use: the CA and the move's bound."""
    libvirt_ca_dir: str
    libvirt_cert_days: int
    refresh_move_timeout_seconds: float
