"""Issue 16: the full lab. Store VMs boot the real KIWI-built image under QEMU (KVM when the
host has it) and run their own minion and firstboot; only the hypervisors stay simulated.

Opt-in (`make test-full`, marker full_lab): the first run builds the image (cold cache), later
runs reuse it. The lab lives in STORE_ROLLOUT_FULL_LAB_DIR (default `.lab-full/`), kept between
runs so its ports, and with them the image's build parameters and cache key, stay the same.
Each phase's time goes to the test output and to `<lab>/phase-times.json`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import libvirt
import pytest
import yaml

from lab.hardware import lab_serial
from lab.manager import Lab
from lab.netboot import DISK_BOOT_MARKER, INSTALLER_DONE_MARKER, host_files
from lab.state import REPO_ROOT, LabInfo, LabPaths
from lab.store_network import BRIDGE, DHCP_FIRST, DHCP_LAST, GATEWAY
from store_rollout.contracts import STEP_WAIT_FOR_HYPERVISOR
from tasks.salt import SaltMasterClient
from tests.helpers import check_store, pxe_config_name, start_rollout

pytestmark = [pytest.mark.full_lab, pytest.mark.timeout(1800)]

FULL_LAB_DIR = Path(os.environ.get("STORE_ROLLOUT_FULL_LAB_DIR", REPO_ROOT / ".lab-full"))
GOOD = ("full-a", "full-b")
WRONG = "full-wrong"
WRONG_MASTER = "10.77.0.99"  # on the store network, where no master listens
# each store host's platform (store_rollout/platforms.py): one good store on each, so a run
# installs from both profiles Cobbler serves (AutoYaST's XML, Agama's JSON)
PLATFORM = {"full-a": "sles15-xen", "full-b": "sle16-kvm", WRONG: "sles15-xen"}
# the installer's reader of each platform's profile (lab/installer/)
PROFILE_READER = {"sles15-xen": "profile.awk", "sle16-kvm": "agama.awk"}


# what a run keeps for the next: the ports (the image's build parameters name the master's)
# and the image cache; everything else starts fresh, so every run rolls out new stores
KEPT = {"ports.json", "secrets.json", "image-cache"}


@pytest.fixture(scope="module")
def full_lab() -> Iterator[LabInfo]:
    lab = Lab.at(FULL_LAB_DIR)
    lab.down()
    for path in FULL_LAB_DIR.iterdir():
        if path.name not in KEPT:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    lab = Lab.at(FULL_LAB_DIR)
    try:
        yield lab.up(full=True)
    finally:
        lab.down()


def inventory(lab: LabInfo, path: Path, store_ids: tuple[str, ...], first_mac: int = 1) -> Path:
    """The stores, their hosts racked in the full lab (the 1st IPMI, the 2nd Redfish...)."""
    from lab.hardware import rack_inventory

    stores = [{"store_id": sid,
               "hypervisor": {"hostname": f"hv-{sid}.full.invalid", "mac": f"52:54:00:fb:01:{n:02x}",
                              "platform": PLATFORM[sid]},
               # the VM's NIC on the store network's bridge, as on a store host's br0
               "vm": {"vcpus": 1, "memory_mib": 512, "disk_gib": 4, "network": BRIDGE},
               "erp": {"site_code": f"FULL-{sid}"}} for n, sid in enumerate(store_ids, start=first_mac)]
    path.write_text(yaml.safe_dump({"stores": stores}))
    rack_inventory(lab, path)
    return path


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, dict[str, Any], str]:
    out, err = proc.communicate(timeout=timeout)
    try:
        return proc.returncode, json.loads(out), err
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON result (rc {proc.returncode}): {err[-3000:]}") from None


def user_env() -> dict[str, str]:
    """What a user has after `lab up`: only STORE_ROLLOUT_SETTINGS_FILE exported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "STORE_ROLLOUT_"))}
    return {**env, "STORE_ROLLOUT_SETTINGS_FILE": str(LabPaths(FULL_LAB_DIR).settings_file)}


def guest(master: SaltMasterClient, minion: str, fun: str, *args: Any) -> Any:
    return master.cmd(minion, fun, list(args), timeout=60)


Outcome = tuple[int, dict[str, Any], str]


def good_image_cached(cache: Path) -> bool:
    """The good stores' image (built for the master at the gateway) is in the cache."""
    for meta in cache.glob("*/meta.json"):
        with contextlib.suppress(OSError, ValueError):
            if (json.loads(meta.read_text()).get("params", {}).get("SALT_MASTER") == GATEWAY
                    and (meta.parent / "image.qcow2").is_file()):
                return True
    return False


@pytest.fixture(scope="module")
def rollouts(full_lab: LabInfo, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """The two good stores and the wrong-master one, rolled out at once (the wrong image's
    KIWI build waits for the good one's: two builds at once would share KIWI's package cache).
    The wrong VM is destroyed as soon as its rollout failed, to free the CPU for the others."""
    inv_dir = tmp_path_factory.mktemp("inventory")
    good_inv = inventory(full_lab, inv_dir / "good.yaml", GOOD)
    wrong_inv = inventory(full_lab, inv_dir / "wrong.yaml", (WRONG,), first_mac=len(GOOD) + 1)
    wrong_env = {**user_env(), "STORE_ROLLOUT_IMAGE_PARAMS": json.dumps(
        {"SALT_MASTER": WRONG_MASTER, "SALT_MASTER_PORT": str(full_lab.salt_ret_port)})}
    started = time.monotonic()
    procs = {sid: start_rollout(user_env(), sid, good_inv) for sid in GOOD}
    while not good_image_cached(Path(full_lab.image_cache_dir)):
        ended = [sid for sid, proc in procs.items() if proc.poll() is not None]
        assert not ended, f"{ended} ended before their image was built: {finish(procs[ended[0]], 10)}"
        time.sleep(2)
    wrong_started = time.monotonic() - started

    def wrong_outcome() -> Outcome:
        outcome = finish(start_rollout(wrong_env, WRONG, wrong_inv, "--vm-contact-timeout",
                                       str(contact_timeout(full_lab)), "--firstboot-timeout",
                                       "1800"), timeout=1500)
        conn = libvirt.open(full_lab.libvirt_uri)
        try:
            with contextlib.suppress(libvirt.libvirtError):
                conn.lookupByName(f"store-{WRONG}-vm").destroy()
        finally:
            conn.close()
        return outcome

    with ThreadPoolExecutor(max_workers=len(GOOD) + 1) as pool:
        futures = {sid: pool.submit(finish, proc, 1500) for sid, proc in procs.items()}
        futures[WRONG] = pool.submit(wrong_outcome)
        outcomes = {sid: future.result() for sid, future in futures.items()}
    PHASES.update(total_seconds=round(time.monotonic() - started, 1),
                  wrong_master_started_at=round(wrong_started, 1), vm_type=full_lab.vm_type)
    return outcomes


def contact_timeout(lab: LabInfo) -> int:
    # a TCG guest's minion first calls about 80 s after its domain starts, alone on the host
    return 60 if lab.vm_type == "kvm" else 120


PHASES: dict[str, Any] = {}


def test_two_stores_boot_the_real_image(full_lab: LabInfo, rollouts: dict[str, Outcome]) -> None:
    results = {}
    for sid in GOOD:
        rc, result, err = rollouts[sid]
        assert rc == 0 and result["state"] == "Completed", (result, err[-3000:])
        results[sid] = result

    master = SaltMasterClient(full_lab.salt_master_config)
    seen: dict[str, dict[str, str]] = {}
    for sid, result in results.items():
        vm = f"store-{sid}-vm"
        check_store(full_lab, sid, result, booted_guest=True)
        # the serial on the host's label (its domain's SMBIOS), checked in step 3
        mac = f"52:54:00:fb:01:{GOOD.index(sid) + 1:02x}"  # as inventory() racks them
        assert result["hypervisor_serial"] == lab_serial(mac), result
        assert guest(master, vm, "grains.get", "id") == vm
        assert guest(master, vm, "grains.get", "firstboot_stage") == "done"
        # the real disk: the bootstrap files are gone, the grains survived two reboots
        bootstrap = guest(master, vm, "provisioning.bootstrap_files")
        assert bootstrap and [p for p in bootstrap if guest(master, vm, "file.file_exists", p)] == []
        assert guest(master, vm, "grains.get", "role") == "store-server"
        # two real reboots: started, highstate and done ran under three kernels' boot ids,
        # and the guest is still in the last one
        boot_ids = result["firstboot"]["boot_ids"]
        assert set(boot_ids) >= {"started", "highstate", "done"}, result["firstboot"]
        assert len({boot_ids["started"], boot_ids["highstate"], boot_ids["done"]}) == 3, boot_ids
        assert guest(master, vm, "file.read", "/proc/sys/kernel/random/boot_id").strip() == \
            boot_ids["done"]
        assert result["firstboot"]["boots_seen"] >= 3, result["firstboot"]
        # on the store network by DHCP, the master at the gateway
        addresses = guest(master, vm, "grains.get", "ipv4")
        dhcp = (ipaddress.IPv4Address(DHCP_FIRST), ipaddress.IPv4Address(DHCP_LAST))
        assert any(dhcp[0] <= ipaddress.IPv4Address(a) <= dhcp[1] for a in addresses), addresses
        assert guest(master, vm, "config.get", "master") == GATEWAY
        seen[sid] = {
            "machine_id": guest(master, vm, "file.read", "/etc/machine-id").strip(),
            "ssh_host_key": guest(master, vm, "file.read", "/etc/ssh/ssh_host_ed25519_key.pub"),
            "minion_key": guest(master, vm, "file.read", "/etc/salt/pki/minion/minion.pub"),
        }
        assert re.fullmatch(r"[0-9a-f]{32}", seen[sid]["machine_id"]), seen[sid]
    # one image, two machines: nothing that identifies a machine is shared
    for field in ("machine_id", "ssh_host_key", "minion_key"):
        assert seen[GOOD[0]][field] != seen[GOOD[1]][field], field

    PHASES["stores"] = {
        sid: {"image_cache_hit": r["image_cache_hit"],
              "image_build_seconds": r["image_build_seconds"],
              "seconds": r["seconds"],
              "step_seconds": r["step_seconds"],
              # seconds into step 6 (which begins once the domain runs)
              "first_minion_start": (r["firstboot"]["minion_starts"] or [None])[0],
              "minion_starts": r["firstboot"]["minion_starts"],
              "stages": r["firstboot"]["stages"]}
        for sid, r in results.items()}
    (FULL_LAB_DIR / "phase-times.json").write_text(json.dumps(PHASES, indent=2))
    print("full lab phase times:", json.dumps(PHASES, indent=2))


def test_store_hosts_boot_from_the_network(full_lab: LabInfo,
                                           rollouts: dict[str, Outcome]) -> None:
    """Issue 29: each store host boots for real. Its PXE ROM gets an address and PXELINUX by
    DHCP and TFTP from Cobbler's dnsmasq, PXELINUX its per-MAC configuration and the
    installer's kernel and initrd; the installer fetches the profile from Cobbler over HTTP
    (AutoYaST's or Agama's, as the host's platform has it) and calls nopxe; at the next boot
    PXELINUX hands back to the BIOS, which boots the disk."""
    dnsmasq = Path(full_lab.services["cobbler-dnsmasq"].log).read_text()
    cobbler_http = (LabPaths(FULL_LAB_DIR).cobbler / "logs" / "cobbler-http.log").read_text()
    for n, sid in enumerate((*GOOD, WRONG), start=1):
        mac, system = f"52:54:00:fb:01:{n:02x}", f"store-{sid}-hv"
        leases = set(re.findall(rf"DHCPACK\(storebr0\) (\S+) {mac}", dnsmasq))
        assert len(leases) == 1, (sid, leases)
        address = leases.pop()
        sent = tftp_sent_files(dnsmasq, address)
        config = pxe_config_name(mac)
        # the installing boot and the boot from disk both ask for the per-MAC configuration
        assert sent.count(config) == 2, (sid, sent)
        assert sent.count("pxelinux.0") == 2 and "ldlinux.c32" in sent, (sid, sent)
        assert any(re.fullmatch(r"images/[^/]+/vmlinuz-\S+", f) for f in sent), (sid, sent)
        assert any(re.fullmatch(r"images/[^/]+/installer-\w+\.cpio\.gz", f) for f in sent), sent
        # the installer's own HTTP client (busybox wget) fetched the profile and called nopxe
        for op in ("autoinstall", "nopxe"):
            assert re.search(rf'"GET /cblr/svc/op/{op}/system/{system} HTTP/1.1" 200 \d+ "Wget"',
                             cobbler_http), (sid, op)
        console = host_files(full_lab, system).console.read_text(errors="replace")
        assert console.index(INSTALLER_DONE_MARKER) < console.rindex(DISK_BOOT_MARKER), sid
        assert f"store-installer: eth0 has {address} from {GATEWAY}" in console, sid
        assert f"store-installer: reading it with {PROFILE_READER[PLATFORM[sid]]}" in console, sid
    # step 3's wait: the host's network boot and install, then its first highstate
    PHASES["host_wait_seconds"] = {
        sid: rollouts[sid][1]["step_seconds"].get(STEP_WAIT_FOR_HYPERVISOR) for sid in GOOD}
    (FULL_LAB_DIR / "phase-times.json").write_text(json.dumps(PHASES, indent=2))
    print("step 3 with the network boot:", PHASES["host_wait_seconds"])


def tftp_sent_files(dnsmasq_log: str, address: str) -> list[str]:
    return re.findall(rf"dnsmasq-tftp\[\d+\]: sent /srv/tftpboot/(\S+) to {re.escape(address)}\n",
                      dnsmasq_log)


def test_wrong_master_in_the_image_fails_step6_naming_the_vm_minion(
        full_lab: LabInfo, rollouts: dict[str, Outcome]) -> None:
    """The guest's minion.d names a master nobody answers at: step 6 fails once the contact
    timeout is over, naming the VM minion, what was awaited and the address, and does not wait
    out the firstboot timeout."""
    rc, result, err = rollouts[WRONG]
    contact = contact_timeout(full_lab)
    assert rc != 0 and result["state"] == "Failed", result
    error = result["error"]
    print("step 6's error, as the operator sees it:", error)
    assert f"VM minion store-{WRONG}-vm never contacted the master within {contact}s" in error, error
    assert f"{WRONG_MASTER}:{full_lab.salt_ret_port}" in error, error
    assert f"salt/minion/store-{WRONG}-vm/start" in error, error
    # failed at step 6 once the contact timeout was over, not after the firstboot timeout
    assert re.search(rf"Task run 'firstboot-{WRONG}' - Finished in state Failed", err), err[-3000:]
    assert result["seconds"] < contact + 900 < 1800, result
