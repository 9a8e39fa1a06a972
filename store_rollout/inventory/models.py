"""The inventory's model: stores, each a hypervisor, a VM and its ERP record, validated field by
field and across stores (no two share a MAC, hostname, IP or VM name); errors name the store,
the field and the fix."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from store_rollout.contracts import IMAGE_VERSION_RE
from store_rollout.inventory.addressing import check_addressing
from store_rollout.inventory.bmc import bmc_identity
from store_rollout.inventory.calendar_spec import CalendarSpec, with_default_calendar
from store_rollout.inventory.fields import (
    HOSTNAME_RE,
    checked_mac,
    minion_id_problem,
    spelled,
    with_default_platform,
)
from store_rollout.regions import DEFAULT_REGION, REGION_RE

STORE_ID_RE = r"^[a-z0-9][a-z0-9-]{0,23}$"


class InventoryError(ValueError):
    """The inventory or a parameter is invalid; the message names the field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HypervisorSpec(_Strict):
    hostname: str = Field(description="FQDN of the store hypervisor")
    mac: str = Field(description="MAC of the PXE interface")
    ip: str = Field("dhcp", description="static IPv4 address or 'dhcp'")
    netmask: str | None = None
    gateway: str | None = None
    # the host's OS and hypervisor (store_rollout/platforms.py); default: defaults.platform,
    # then the chain's setting hypervisor_platform
    platform: Literal["sles15-xen", "sle16-kvm"] | None = Field(
        None, description="sles15-xen (SLES 15 SP7 + Xen) or sle16-kvm (SLES/Leap 16 + KVM)")
    cobbler_profile: str | None = Field(
        None, description="Cobbler profile (default: the platform's, store-hypervisor-<platform>)")
    dom0_mem: Annotated[str | None, spelled(
        r"[0-9]+[KMG]?(,max:[0-9]+[KMG]?)?", "dom0_mem", "like 4096M,max:4096M")] = Field(
        None, description="Xen dom0's memory (sles15-xen only; default 4096M,max:4096M)")
    power_type: Literal["ipmi", "redfish"] | None = Field(
        None, description="the BMC's protocol, ipmi or redfish (default: settings power_type)")
    power_address: Annotated[str | None, spelled(
        r"(https?://)?[A-Za-z0-9._:\[\]-]+(/[^\s]*)?", "BMC address",
        "a host name or IP (IPMI), or https://host[:port] (Redfish)")] = Field(
        None, description="the BMC's address: host or IP (IPMI), URL or host (Redfish)")
    power_port: int | None = Field(None, ge=1, le=65535,
                                   description="the BMC's port (default: IPMI 623, Redfish 443)")
    redfish_system_id: Annotated[str | None, spelled(
        r"[A-Za-z0-9._-]{1,64}", "Redfish system id", "the id under /redfish/v1/Systems/")] = Field(
        None, description="the host's Redfish system (default: the BMC's only system)")
    bmc_credentials_block: str | None = Field(
        None, description="BMC Credentials Block of this host (default: settings)")
    ipmi_cipher_suite: int | None = Field(
        None, ge=0, le=17, description="IPMI cipher suite (default: the best the BMC offers)")
    serial: Annotated[str | None, spelled(
        r"[A-Za-z0-9][A-Za-z0-9._/-]{0,63}", "serial number",
        "the SMBIOS serial on the host's label: letters, digits, '.', '_', '/', '-'")] = Field(
        None, description="the host's serial number (SMBIOS, as on its label): step 3 refuses "
                          "a host that reports another, before anything is done on it")
    # a refreshed box's own id (`store-rollout refresh` says what to write): store-<id>-hv-
    # <last 6 hex digits of mac>; checked against the store by Store
    minion_id: str | None = Field(None, description="the hypervisor's minion id when not "
                                  "store-<id>-hv: a refreshed box's, store-<id>-hv-<mac suffix>")

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: Any) -> Any:
        # an inventory is a file copied around (ERP exports, spreadsheets): no BMC login in it
        if isinstance(data, dict):
            given = sorted(k for k in ("power_user", "power_password") if k in data)
            if given:
                raise ValueError(f"{' and '.join(given)}: BMC logins are not read from the "
                                 "inventory; save them in a BMC Credentials Block and name it "
                                 "in hypervisor.bmc_credentials_block (or, for every store, in "
                                 "STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK), then remove "
                                 f"{'it' if len(given) == 1 else 'them'}")
        return data

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, v: str) -> str:
        v = v.strip().lower()
        if not HOSTNAME_RE.fullmatch(v):
            raise ValueError(f"invalid hostname {v!r}: use letters, digits, '-' and dots")
        return v

    @field_validator("mac")
    @classmethod
    def _mac(cls, v: str) -> str:
        return checked_mac(v)

    @field_validator("ip")
    @classmethod
    def _ip(cls, v: str) -> str:
        if v.strip().lower() == "dhcp":
            return "dhcp"
        try:
            addr = ipaddress.IPv4Address(v.strip())
        except ValueError:
            raise ValueError(f"invalid IPv4 address {v!r}: write a.b.c.d or 'dhcp'") from None
        if addr.is_multicast or addr.is_unspecified or addr.is_loopback:
            raise ValueError(f"IP {v!r} cannot be a host address: use the hypervisor's LAN IP")
        return str(addr)

    @field_validator("netmask", "gateway")
    @classmethod
    def _optional_ip(cls, v: str | None) -> str | None:
        if v in (None, ""):
            return None
        try:
            return str(ipaddress.IPv4Address(str(v).strip()))
        except ValueError:
            raise ValueError(f"invalid IPv4 address {v!r}: write a.b.c.d") from None

    @model_validator(mode="after")
    def _addressing(self) -> HypervisorSpec:
        check_addressing(self.ip, self.netmask, self.gateway)
        return self


class VmSpec(_Strict):
    name: Annotated[str | None, spelled(r"[a-z0-9][a-z0-9-]{0,62}", "VM name",
                                         "lowercase letters, digits and '-'")] = Field(
        None, description="libvirt domain name (default store-<id>-vm)")
    vcpus: int = Field(2, ge=1, le=64, description="virtual CPUs, 1..64")
    memory_mib: int = Field(4096, ge=128, le=262144, description="memory in MiB, 128..262144")
    disk_gib: int = Field(20, ge=1, le=2048, description="disk size in GiB, 1..2048")
    # the store's data disk (store_rollout/contracts.py DATA_DISK_*): made once, kept across
    # image updates, VM recreation and rollback; only decommission removes it
    data_disk_gib: int = Field(8, ge=1, le=4096, description="data disk size in GiB, 1..4096")
    # the image version the store should run (settings `image_versions`); none: the chain's
    # `image_version`
    image_version: Annotated[str | None, spelled(IMAGE_VERSION_RE, "image version",
                                                  "lowercase letters, digits, '.', '_', '-'")] = \
        Field(None, description="image version (settings image_versions), default the chain's")
    network: Annotated[str, spelled(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}", "network",
                                     "a bridge name like br0, or 'none'")] = Field(
        "br0", description="host bridge for the VM NIC, or 'none'")


class ErpSpec(_Strict):
    site_code: Annotated[str, spelled(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", "ERP site code",
                                       "letters, digits, '-' and '_'")] = Field(
        description="the store's site code in the ERP")
    cost_center: str | None = None


class Store(_Strict):
    store_id: str = Field(pattern=STORE_ID_RE, description="lowercase letters, digits, '-'")
    # the Salt master, Cobbler and work pool that roll the store out (store_rollout/regions.py)
    region: str = Field(DEFAULT_REGION, pattern=REGION_RE,
                        description="the store's region, as the regions file names it")
    hypervisor: HypervisorSpec
    vm: VmSpec = Field(default_factory=lambda: VmSpec.model_validate({}))
    erp: ErpSpec
    calendar: CalendarSpec | None = Field(
        None, description="time zone, maintenance windows, blackout dates (default: "
                          "defaults.calendar, else the chain's default calendar; with none, "
                          "disruptive steps are refused)")

    @field_validator("calendar")
    @classmethod
    def _complete_calendar(cls, value: CalendarSpec | None) -> CalendarSpec | None:
        if value is not None and value.missing():
            names = " and ".join(f"calendar.{name}" for name in value.missing())
            raise ValueError(f"{names} missing: set it for the store or in defaults.calendar")
        return value

    @field_validator("hypervisor")
    @classmethod
    def _own_minion_id(cls, value: HypervisorSpec, info: ValidationInfo) -> HypervisorSpec:
        store_id = info.data.get("store_id")
        problem = value.minion_id and store_id and minion_id_problem(value.minion_id, store_id,
                                                                     value.mac)
        if problem:
            raise ValueError(problem)
        return value

    @property
    def hypervisor_minion_id(self) -> str:
        return self.hypervisor.minion_id or f"store-{self.store_id}-hv"

    @property
    def vm_minion_id(self) -> str:
        return f"store-{self.store_id}-vm"

    @property
    def vm_name(self) -> str:
        return self.vm.name or f"store-{self.store_id}-vm"

    @property
    def cobbler_system(self) -> str:
        return self.hypervisor_minion_id


class InventoryDefaults(_Strict):
    calendar: CalendarSpec | None = None
    platform: Literal["sles15-xen", "sle16-kvm"] | None = None


class Inventory(_Strict):
    stores: list[Store]
    defaults: InventoryDefaults | None = None
    # where it was read from, for messages (a run started in the UI shows only its message)
    _source: str = PrivateAttr(default="inventory")

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        return with_default_platform(with_default_calendar(data))

    @model_validator(mode="after")
    def _unique(self) -> Inventory:
        for label, key in (("store_id", lambda s: s.store_id),
                           ("hypervisor.mac", lambda s: s.hypervisor.mac),
                           ("hypervisor.hostname", lambda s: s.hypervisor.hostname),
                           ("hypervisor.ip", lambda s: s.hypervisor.ip),
                           ("hypervisor.serial", lambda s: s.hypervisor.serial),
                           ("vm.name", lambda s: s.vm_name),
                           ("hypervisor.power_address (BMC address and port)",
                            lambda s: bmc_identity(s.hypervisor.power_address,
                                                   s.hypervisor.power_type,
                                                   s.hypervisor.power_port,
                                                   s.hypervisor.redfish_system_id))):
            seen: dict[Any, str] = {}
            for store in self.stores:
                value = key(store)
                if value in ("dhcp", None):
                    continue
                if value in seen:
                    shown = ":".join(v for v in value if v) if isinstance(value, tuple) else value
                    raise ValueError(f"duplicate {label} {shown!r} in stores {seen[value]!r} "
                                     f"and {store.store_id!r}: each store needs its own")
                seen[value] = store.store_id
        return self

    def get(self, store_id: str) -> Store:
        for store in self.stores:
            if store.store_id == store_id:
                return store
        known = ", ".join(s.store_id for s in self.stores[:10]) or "none"
        more = f" and {len(self.stores) - 10} more" if len(self.stores) > 10 else ""
        raise InventoryError(f"store_id {store_id!r} is not in the inventory {self._source} "
                             f"(known: {known}{more}); add it to that file or check the id")

    def select(self, store_ids: list[str] | None) -> list[Store]:
        """The given stores in order (every store when none given); a store given twice is an
        error: two runs of one store in one batch would drive one hypervisor at once."""
        if not store_ids:
            return list(self.stores)
        repeated = sorted({s for s in store_ids if store_ids.count(s) > 1})
        if repeated:
            raise InventoryError(f"store_ids: {', '.join(map(repr, repeated))} given more than "
                                 "once; a store is rolled out once per run: remove the repeats")
        return [self.get(s) for s in store_ids]
