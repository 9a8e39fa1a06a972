"""The store host platforms, each in one place: what a store host is installed with and runs.

A store's platform is `hypervisor.platform` in the inventory, else the inventory's
`defaults.platform`, else the chain's (or its region's) setting `hypervisor_platform`; with
none, nothing is done for the store (fail closed: a platform decides the OS a host is wiped
for). The steps are the same on each; what differs is read off its `Platform`: the install
profile and Cobbler profile, the hypervisor formula's parameters (salt_states/hypervisor/
parameters/platform/<name>.yaml), the libvirt URI and VM type, the host's Python floor, the
network stack, the update repositories and the lifecycle (docs/production.md, with sources).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Final, Literal
from urllib.parse import urlsplit

from store_rollout.update_repos import DEFAULT_UPDATE_REPOS

if TYPE_CHECKING:
    from store_rollout.inventory import Store
    from store_rollout.settings_parts import HostSettings

PlatformName = Literal["sles15-xen", "sle16-kvm"]
# the product a sle16-kvm host installs (setting sle16_product): Agama's product ids
Sle16Product = Literal["sles", "leap"]
# libvirt's emulation: the lab runs it for either platform (no Xen or nested KVM there)
EMULATION_VM_TYPE: Final = "qemu"


class PlatformError(ValueError):
    """A store's platform is missing or cannot work with its settings; names field and fix."""


@dataclass(frozen=True)
class Platform:
    name: str
    title: str
    installer: Literal["autoyast", "agama"]
    # the Cobbler profile step 2 puts the host on, and the template it serves (image_builds/)
    cobbler_profile: str
    template: str
    libvirt_uri: str
    vm_type: Literal["xen", "kvm"]
    # the oldest Python the host runs our Salt modules on (checked with vermin in make test)
    host_python: tuple[int, int]
    salt_on_host: str
    network_stack: Literal["wicked", "NetworkManager"]
    # products it installs: the setting's value -> the installer's product id
    products: dict[str, str]
    supported_until: date
    lifecycle_source: str

    def product_id(self, sle16_product: str) -> str:
        return self.products.get(sle16_product) or next(iter(self.products.values()))

    def profile_of(self, store: Store) -> str:
        """The Cobbler profile `store`'s host installs from: its own, else this platform's."""
        return store.hypervisor.cobbler_profile or self.cobbler_profile

    def needs_registration(self, sle16_product: str) -> bool:
        """SLES registers (its updates come through the registration server); Leap does not."""
        return self.product_id(sle16_product).upper().startswith("SLES")


PLATFORMS: Final[dict[str, Platform]] = {
    "sles15-xen": Platform(
        name="sles15-xen", title="SLES 15 SP7 with Xen 4.20", installer="autoyast",
        cobbler_profile="store-hypervisor-sles15-xen",
        template="autoyast/sles15-xen.xml", libvirt_uri="xen:///system", vm_type="xen",
        host_python=(3, 6), salt_on_host="SUSE salt 3006.0 (Python 3.6) or the Salt Bundle",
        network_stack="wicked", products={"sles": "SLES"},
        supported_until=date(2034, 7, 31),
        lifecycle_source="SUSE release notes, adoc/sles/15sp7/about-product.adoc (LTSS to 2037)"),
    "sle16-kvm": Platform(
        name="sle16-kvm", title="SLES 16.0 / Leap 16.0 with KVM", installer="agama",
        cobbler_profile="store-hypervisor-sle16-kvm",
        template="agama/sle16-kvm.json", libvirt_uri="qemu:///system", vm_type="kvm",
        host_python=(3, 11), salt_on_host="the Salt Bundle (venv-salt-minion) or onedir Salt",
        network_stack="NetworkManager", products={"sles": "SLES", "leap": "Leap_16.0"},
        supported_until=date(2027, 10, 31),
        lifecycle_source="openSUSE news 2025-10-01 (Leap 16.0: 24 months); SLES 16: SUSE "
                         "lifecycle"),
}
PLATFORM_NAMES: Final = tuple(PLATFORMS)
# the OS a store host ran before platforms, by what its grains say (HOST_OS_GRAINS joined):
# out of support since the date (reconcile flags such a host)
RETIRED_OS: Final = {"Leap 15.6": date(2026, 4, 30)}
HOST_OS_GRAINS: Final = ("osfullname", "osrelease")
# libvirt URI schemes each VM type is driven through
_URI_SCHEMES: Final = {"xen": ("xen",), "kvm": ("qemu",), "qemu": ("qemu",)}
_MISSING = (f"hypervisor.platform missing: set it to one of {', '.join(PLATFORM_NAMES)} for the "
            "store (CSV column hv_platform), in the inventory's defaults.platform, or for the "
            "chain or region as STORE_ROLLOUT_HYPERVISOR_PLATFORM")


def platform_named(name: str, field: str = "hypervisor.platform") -> Platform:
    try:
        return PLATFORMS[name]
    except KeyError:
        raise PlatformError(f"{field}: unknown platform {name!r}: use one of "
                            f"{', '.join(PLATFORM_NAMES)}") from None


def store_platform(own: str | None, chain_default: str) -> Platform:
    """The platform of a store whose inventory gives `own` (its own or the inventory's
    default), else the chain's setting."""
    if own:
        return platform_named(own)
    if chain_default:
        return platform_named(chain_default, "hypervisor_platform")
    raise PlatformError(_MISSING)


def platform_problems(platform: Platform, *, vm_type: str, libvirt_uri: str,
                      dom0_mem: str | None, sle16_product: str, registration_url: str,
                      registration_code_block: str) -> list[str]:
    """Why a host of `platform` cannot work with these settings (empty: it can), each naming
    the field and the fix."""
    problems = []
    scheme = urlsplit(libvirt_uri).scheme.split("+")[0] if libvirt_uri else ""
    # a QEMU libvirt the settings name, running qemu or kvm domains, stands in for either
    # platform's hypervisor (the lab): both given explicitly, never a default
    stand_in = scheme == "qemu" and vm_type in (EMULATION_VM_TYPE, "kvm")
    if vm_type and vm_type not in (platform.vm_type, EMULATION_VM_TYPE) and not stand_in:
        problems.append(f"vm_type {vm_type}: a {platform.name} host runs {platform.vm_type} "
                        f"VMs ({platform.title}): set STORE_ROLLOUT_VM_TYPE={platform.vm_type} "
                        "(or leave it unset), or give the store another hypervisor.platform")
    wanted = _URI_SCHEMES[vm_type or platform.vm_type]
    if scheme and scheme not in wanted:
        problems.append(f"hypervisor_libvirt_uri {libvirt_uri}: a {platform.name} host's "
                        f"libvirt is {platform.libvirt_uri}: leave the setting unset or give it "
                        f"a {wanted[0]}:// URI")
    if dom0_mem and platform.vm_type != "xen":
        problems.append(f"hypervisor.dom0_mem {dom0_mem}: a Xen hypervisor option, and a "
                        f"{platform.name} host boots no Xen: remove it, or use platform sles15-xen")
    if sle16_product not in platform.products and platform.name == "sle16-kvm":
        problems.append(f"sle16_product {sle16_product}: use one of {', '.join(platform.products)}")
    if platform.needs_registration(sle16_product):
        if not registration_url:
            problems.append(f"registration_url missing: a {platform.name} host installs SLES, "
                            "which registers with the chain's RMT, SUSE Manager or SCC: set "
                            "STORE_ROLLOUT_REGISTRATION_URL")
        elif urlsplit(registration_url).hostname == "scc.suse.com" and not registration_code_block:
            problems.append("registration_code_block missing: SCC registers a host with the "
                            "chain's registration code: save it in a Prefect Secret block and "
                            "name it in STORE_ROLLOUT_REGISTRATION_CODE_BLOCK")
    return problems


def host_platform(store: Store, hosts: HostSettings) -> Platform:
    """`store`'s platform, checked against the settings its host is installed and driven with;
    PlatformError naming the store, each field and its fix when it cannot work."""
    try:
        platform = store_platform(store.hypervisor.platform, hosts.hypervisor_platform)
    except PlatformError as exc:
        raise PlatformError(f"store {store.store_id}: {exc}") from None
    problems = platform_problems(
        platform, vm_type=hosts.vm_type, libvirt_uri=hosts.hypervisor_libvirt_uri,
        dom0_mem=store.hypervisor.dom0_mem, sle16_product=hosts.sle16_product,
        registration_url=hosts.registration_url,
        registration_code_block=hosts.registration_code_block)
    if problems:
        raise PlatformError(f"store {store.store_id} ({platform.name}): {'; '.join(problems)}")
    return platform


def libvirt_uri(platform: Platform, hosts: HostSettings) -> str:
    """The URI the host's libvirt is driven through: the setting's, else the platform's."""
    return hosts.hypervisor_libvirt_uri or platform.libvirt_uri


def vm_type(platform: Platform, hosts: HostSettings) -> str:
    """The VM type step 5 defines: the setting's (the lab's emulation), else the platform's."""
    return hosts.vm_type or platform.vm_type


def update_repos(platform: Platform, hosts: HostSettings) -> list[str]:
    """The update repositories the host installs from and keeps: the setting's, else the
    platform's own (store_rollout/update_repos.py)."""
    if hosts.hypervisor_update_repos is not None:
        return list(hosts.hypervisor_update_repos)
    if platform.needs_registration(hosts.sle16_product):
        return []  # the registration server adds the product's update repositories
    return list(DEFAULT_UPDATE_REPOS[platform.name])


def store_vm_type(store: Store, hosts: HostSettings) -> str:
    """The VM type step 5 defines on `store`'s host (its platform checked first)."""
    return vm_type(host_platform(store, hosts), hosts)


def retired_since(host_os: str | None) -> date | None:
    """When the OS a host reports went out of support; None for a supported one (or none)."""
    return RETIRED_OS.get(host_os or "")
