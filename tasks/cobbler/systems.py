"""A hypervisor's Cobbler system record: what the rollout wants it to be (`SystemSpec`; a
store's, as step 2 writes it and plan compares it: `system_spec`), its fields as Cobbler stores
them, the differences between the two (plan and reconcile), and when step 2 last powered the
host on into its install (`power_cycled_at`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from store_rollout import platforms
from store_rollout.contracts import (
    AUTOSIGN_GRAIN,
    DOM0_MEM_META,
    INSTALL_PRODUCT_META,
    POWER_CYCLED_META,
    REGISTRATION_CODE_META,
    REGISTRATION_URL_META,
    ROOT_PASSWORD_HASH_META,
    STORE_PLATFORM_META,
    UPDATE_REPOS_META,
)
from store_rollout.inventory import Store
from store_rollout.settings_parts import HostSettings, SaltSettings
from store_rollout.update_repos import update_repos_meta


@dataclass(frozen=True)
class SystemSpec:
    """What the rollout wants Cobbler to know about one hypervisor."""

    name: str
    hostname: str
    mac: str
    profile: str
    ip: str | None = None
    netmask: str | None = None
    gateway: str | None = None
    interface: str = "eth0"
    # not in repr: the one-time token and the root password's hash
    autoinstall_meta: dict[str, str] = field(default_factory=dict, repr=False)

    def interface_fields(self) -> dict[str, Any]:
        i = self.interface
        fields: dict[str, Any] = {f"macaddress-{i}": self.mac, f"dnsname-{i}": self.hostname,
                                  f"static-{i}": bool(self.ip)}
        if self.ip:
            fields[f"ipaddress-{i}"] = self.ip
        if self.netmask:
            fields[f"netmask-{i}"] = self.netmask
        return fields


def system_spec(store: Store, salt: SaltSettings, hosts: HostSettings, token: str,
                root_hash: str = "", pin: dict[str, str] | None = None,
                registration_code: str = "") -> SystemSpec:
    """The Cobbler record step 2 writes for a store's hypervisor, on its platform's profile
    (store_rollout/platforms.py; PlatformError when the store's platform and the settings
    cannot work together). `token`: its one-time autosign token; `root_hash`: crypt(3) of its
    root password, left out of the record when empty, as for a plan, which never reads the
    password; `pin`: the master's key fingerprint and hash_type, tasks/salt/master_key.py, left
    out as well when not given; `registration_code`: the SLES registration code (its Secret
    block's value), left out when empty. No BMC field: step 2 drives the BMC itself."""
    hv = store.hypervisor
    platform = platforms.host_platform(store, hosts)
    secrets = {ROOT_PASSWORD_HASH_META: root_hash, REGISTRATION_CODE_META: registration_code}
    registers = platform.needs_registration(hosts.sle16_product)
    return SystemSpec(
        name=store.cobbler_system, hostname=hv.hostname, mac=hv.mac,
        profile=platform.profile_of(store),
        ip=None if hv.ip == "dhcp" else hv.ip, netmask=hv.netmask, gateway=hv.gateway,
        autoinstall_meta={
            "salt_master": salt.salt_master_address,
            "salt_master_port": str(salt.salt_ret_port),
            "salt_publish_port": str(salt.salt_publish_port),
            "minion_id": store.hypervisor_minion_id, "store_id": store.store_id,
            "autosign_grain": AUTOSIGN_GRAIN, "autosign_token": token,
            STORE_PLATFORM_META: platform.name,
            INSTALL_PRODUCT_META: platform.product_id(hosts.sle16_product),
            "virt_uri": platforms.libvirt_uri(platform, hosts),
            "vm_images_dir": hosts.vm_images_dir,
            UPDATE_REPOS_META: update_repos_meta(platforms.update_repos(platform, hosts)),
            **({REGISTRATION_URL_META: hosts.registration_url} if registers else {}),
            **({DOM0_MEM_META: hv.dom0_mem} if hv.dom0_mem else {}),
            **{k: v for k, v in secrets.items() if v}, **(pin or {}),
        })


def power_cycled_at(record: dict[str, Any] | None) -> datetime | None:
    """When step 2 last powered the host on into its install, as its Cobbler record says."""
    meta = (record or {}).get("autoinstall_meta")
    stamp = meta.get(POWER_CYCLED_META) if isinstance(meta, dict) else None
    try:
        return datetime.fromisoformat(str(stamp)) if stamp else None
    except ValueError:  # edited by hand: as if absent
        return None


# Cobbler hands power_pass back in clear to any get_system caller and its power manager logs
# it: step 2 drives the BMC itself, and the record keeps none of its login (an older release's
# record is cleared by the next upsert)
BMC_FIELDS = ("power_address", "power_user", "power_pass", "power_id")
# never shown in a plan: a BMC password an older record still holds and the hash of root's
# password (at most "changes"; a plan's spec has no hash, it never reads the password), and the
# one-time token each install gets anew
SECRET_FIELDS = frozenset({"power_pass", f"autoinstall_meta.{ROOT_PASSWORD_HASH_META}",
                           f"autoinstall_meta.{REGISTRATION_CODE_META}"})
ONE_TIME_FIELDS = frozenset({"autoinstall_meta.autosign_token"})


def spec_fields(spec: SystemSpec) -> dict[str, Any]:
    """The record fields `upsert_system` sets for `spec`, flat (`interfaces.eth0.mac_address`,
    `autoinstall_meta.<key>`), as `record_fields` reads them back from Cobbler."""
    i = spec.interface
    fields: dict[str, Any] = {
        "profile": spec.profile, "hostname": spec.hostname,
        f"interfaces.{i}.mac_address": spec.mac.lower(), f"interfaces.{i}.dns_name": spec.hostname,
        f"interfaces.{i}.static": bool(spec.ip),
    }
    if spec.ip:
        fields[f"interfaces.{i}.ip_address"] = spec.ip
    if spec.netmask:
        fields[f"interfaces.{i}.netmask"] = spec.netmask
    if spec.gateway:
        fields["gateway"] = spec.gateway
    fields.update({f"autoinstall_meta.{k}": str(v) for k, v in spec.autoinstall_meta.items()})
    fields.update(dict.fromkeys(BMC_FIELDS, ""))
    fields["netboot_enabled"] = True
    return fields


def record_fields(record: dict[str, Any]) -> dict[str, Any]:
    """A Cobbler system record (get_system) flattened the way `spec_fields` names fields."""
    fields: dict[str, Any] = {k: v for k, v in record.items()
                              if isinstance(v, str | bool | int) and k != "interfaces"}
    for name, iface in (record.get("interfaces") or {}).items():
        for key, value in (iface or {}).items():
            fields[f"interfaces.{name}.{key}"] = value.lower() if key == "mac_address" else value
    meta = record.get("autoinstall_meta") or {}
    fields.update({f"autoinstall_meta.{k}": str(v) for k, v in meta.items()})
    return fields


@dataclass(frozen=True)
class FieldChange:
    """One field a rollout's upsert would set differently; values None for secret fields."""

    field: str
    current: Any
    wanted: Any

    def describe(self) -> str:
        if self.field in SECRET_FIELDS:
            return f"{self.field}: changes (secret, not shown)"
        if self.current is None:
            return f"{self.field}: {self.wanted!r} (new)"
        return f"{self.field}: {self.current!r} -> {self.wanted!r}"


def system_changes(spec: SystemSpec, record: dict[str, Any] | None) -> list[FieldChange]:
    """What upserting `spec` would change in `record` (None: the record is created, every
    field is new), field by field, without secret values."""
    current = record_fields(record) if record is not None else {}
    changes = []
    for key, wanted in spec_fields(spec).items():
        if key in ONE_TIME_FIELDS or current.get(key) == wanted:
            continue
        if key in SECRET_FIELDS:
            changes.append(FieldChange(key, None, None))
        else:
            changes.append(FieldChange(key, current.get(key), wanted))
    return changes
