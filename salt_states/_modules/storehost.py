"""Store hypervisor host facts: its Xen boot entry, whether it runs as Xen dom0, and the check
that makes "ready" mean ready (hypervisor.checks)."""

import ipaddress
import json
import os
import re
import shutil

from salt.exceptions import CommandExecutionError

__virtualname__ = "storehost"
# top-level entries only: "menuentry '<title>' ..." at the start of a line (submenus are indented)
MENUENTRY = re.compile(r"^menuentry\s+'([^']+)'", re.MULTILINE)
# /etc/grub.d/20_linux_xen titles its entries "<OS>, with Xen hypervisor", OS being
# GRUB_DISTRIBUTOR as it is (SUSE's grub2-linux.patch drops upstream's " GNU/Linux"); YaST leaves
# GRUB_DISTRIBUTOR empty (yast2-bootloader grub2base.rb) and SUSE's grub2-mkconfig then takes
# "${NAME} ${VERSION}" of /etc/os-release (grub2-default-distributor.patch): "SLES 15-SP7, with
# Xen hypervisor" on SLES 15 SP7, "openSUSE Leap 15.6, with Xen hypervisor" on Leap. Matched by
# this suffix alone, never by a distribution's name.
XEN_TITLE = ", with Xen hypervisor"


def __virtual__():
    return __virtualname__


def xen_boot_entry(grub_cfg="/boot/grub2/grub.cfg"):
    """The exact title of the first top-level Xen entry of grub.cfg."""
    try:
        with open(grub_cfg, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise CommandExecutionError(f"cannot read {grub_cfg}: {exc}") from None
    for title in MENUENTRY.findall(text):
        if XEN_TITLE in title:
            return title
    raise CommandExecutionError(
        f"{grub_cfg} has no entry titled '...{XEN_TITLE}': is the Xen pattern installed "
        "(patterns-server-xen_server) and grub2-mkconfig run after it?")


def is_dom0(capabilities="/proc/xen/capabilities"):
    """True when this host runs as Xen's control domain."""
    try:
        with open(capabilities, encoding="utf-8") as fh:
            return "control_d" in fh.read()
    except OSError:
        return False


def libvirt_driver(uri=None):
    """The libvirt driver behind the minion's connection (virConnectGetType: Xen, QEMU, ...)."""
    import libvirt

    uri = uri or __salt__["config.get"]("virt:connection:uri", None)
    try:
        conn = libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise CommandExecutionError(f"libvirt connection {uri} failed: {exc}") from None
    try:
        return conn.getType()
    finally:
        conn.close()


def _ip_json(*args):
    out = __salt__["cmd.run_all"](["ip", "-j", *args], python_shell=False)
    if out["retcode"] != 0:
        return None, out.get("stderr", "").strip()
    return json.loads(out["stdout"] or "[]"), ""


def bridge_problems(bridge):
    """What differs between the host bridge and the addressing AutoYaST gave it (the grain
    store_rollout_bridge: name, bootproto static|dhcp, address, netmask, gateway)."""
    name = bridge.get("name", "br0")
    links, error = _ip_json("address", "show", "dev", name)
    if links is None:
        return [f"bridge {name} missing ({error})"]
    found = sorted(f"{a['local']}/{a['prefixlen']}" for link in links
                   for a in link.get("addr_info", []) if a.get("family") == "inet")
    problems = []
    if bridge.get("bootproto") == "static":
        want = ipaddress.ip_interface(f"{bridge['address']}/{bridge['netmask']}").with_prefixlen
        if want not in found:
            problems.append(f"bridge {name} has {', '.join(found) or 'no IPv4 address'}, "
                            f"not the inventory's static {want}")
        gateway = bridge.get("gateway")
        if gateway:
            routes, _ = _ip_json("route", "show", "default")
            if not any(r.get("gateway") == gateway and r.get("dev") == name
                       for r in routes or []):
                problems.append(f"no default route via {gateway} on {name}")
    elif not found:
        problems.append(f"bridge {name} has no IPv4 address (DHCP)")
    return problems


def check(driver="Xen", require_dom0=True, tools=(), bridge=None, devices=()):
    """Fail unless the hypervisor is ready to run store VMs; the message says what is missing.

    `tools`: commands step 5 runs here (storevirt: qemu-img for the overlay disk, xorriso for
    the identity seed). `bridge`: the addressing br0 must still have (None: not checked).
    `devices`: paths that must exist (sle16-kvm: /dev/kvm, made by the kvm module)."""
    problems = []
    if bridge:
        problems += bridge_problems(bridge)
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        problems.append(f"commands not found: {', '.join(missing)} (install their packages)")
    absent = [path for path in devices if not os.path.exists(path)]
    if absent:
        problems.append(f"devices missing: {', '.join(absent)} (their kernel module is not "
                        "loaded: hypervisor.kvm loads it, with virtualization on in the firmware)")
    dom0 = is_dom0()
    if require_dom0 and not dom0:
        problems.append("not running as Xen dom0 (/proc/xen/capabilities has no control_d): "
                        "boot the Xen entry")
    try:
        found = libvirt_driver()
    except CommandExecutionError as exc:
        problems.append(str(exc))
    else:
        if found != driver:
            problems.append(f"libvirt reports the {found} driver, not {driver}")
    if problems:
        raise CommandExecutionError("hypervisor not ready: " + "; ".join(problems))
    return {"driver": driver, "dom0": dom0, "tools": list(tools),
            "bridge": (bridge or {}).get("name"), "devices": list(devices)}
