"""How the rollout talks to its outside systems, part of the settings (store_rollout/settings.py):
plain HTTP off the loopback only where an `insecure_<system>_http` setting says so
(store_rollout/transport.py), and the CA bundles that verify their certificates."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator

from store_rollout.settings_calendar import DefaultCalendarSettings
from store_rollout.transport import checked_url


class TransportSettings(DefaultCalendarSettings):
    insecure_cobbler_http: bool = Field(False, description="allow http:// to Cobbler off the "
                                        "loopback (a test setup only; logged)")
    insecure_erp_http: bool = Field(False, description="allow http:// to the ERP off the loopback")
    insecure_redfish_http: bool = Field(False, description="allow http:// to Redfish BMCs off "
                                        "the loopback")
    # PEM files of the CAs that signed each system's certificate (empty: the system's trust store)
    cobbler_ca_bundle: str = Field("", description="CA bundle verifying Cobbler's certificate")
    erp_ca_bundle: str = Field("", description="CA bundle verifying the ERP's certificate")
    redfish_ca_bundle: str = Field("", description="CA bundle verifying Redfish BMCs' certificates")

    @field_validator("cobbler_ca_bundle", "erp_ca_bundle", "redfish_ca_bundle")
    @classmethod
    def _bundle_exists(cls, value: str) -> str:
        if value and not Path(value).is_file():
            raise ValueError(f"{value}: no such file (a PEM file of CA certificates, or empty)")
        return value

    @field_validator("cobbler_url", "erp_url", check_fields=False)
    @classmethod
    def _https(cls, value: str, info: ValidationInfo) -> str:
        system = str(info.field_name).split("_")[0]
        if not value:  # required or replaced by a Block: the other validator says which
            return value
        return checked_url(value, system, f"STORE_ROLLOUT_{str(info.field_name).upper()}",
                           bool(info.data.get(f"insecure_{system}_http")))
