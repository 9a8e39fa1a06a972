"""The store VM's libvirt domain as step 5 defines it: virt.init's arguments per hypervisor type
(device models, the system overlay, the data disk, the identity seed CD-ROM) and the domain XML
the virt module's own generator makes of them (`store-rollout vm-xml`)."""

from __future__ import annotations

import copy
import posixpath
from dataclasses import dataclass
from typing import Any

from store_rollout.contracts import DATA_DISK_FILE
from store_rollout.inventory import Store


@dataclass(frozen=True)
class DeviceModels:
    """How the store VM's devices look on one hypervisor type, as the virt module's disk and
    NIC `model` values (its generator maps a disk model to bus and target: virtio -> vd*,
    xen -> xvd*, ide -> hd*, anything else -> sd*)."""

    disk: str
    seed: str  # the identity seed CD-ROM
    nic: str | None  # None: no <model>, the driver's default


DEVICE_MODELS: dict[str, DeviceModels] = {
    # Xen HVM under libxl: see docs/production.md and tests/unit/tasks/test_vm_xml.py for libxl's
    # rules
    "xen": DeviceModels(disk="xen", seed="xen", nic="e1000"),
    "kvm": DeviceModels(disk="virtio", seed="sata", nic="virtio"),
    "qemu": DeviceModels(disk="virtio", seed="sata", nic="virtio"),
}


def interfaces_for(network: str, models: DeviceModels) -> list[dict[str, Any]]:
    if network == "none":
        return []
    return [{"name": "eth0", "type": "bridge", "source": network, "model": models.nic}]


def vm_paths(store: Store, images_dir: str) -> dict[str, str]:
    """The VM's files on its hypervisor (storevirt.create_overlay, create_data_disk and
    seed_path lay them out)."""
    vm_dir = posixpath.join(images_dir, store.vm_name)
    return {"disk": posixpath.join(vm_dir, "system.qcow2"),
            "data": posixpath.join(vm_dir, DATA_DISK_FILE),
            "seed": posixpath.join(vm_dir, "seed.iso")}


def init_kwargs(store: Store, hypervisor_type: str, disk_path: str, seed_path: str,
                data_path: str) -> dict[str, Any]:
    """virt.init arguments: start=False, the overlay disk (first: the guest boots it), the data
    disk (raw, the same disk model: vdb / xvdb), the identity seed CD-ROM, serial console, VNC
    on localhost, with `hypervisor_type`'s device models."""
    models = DEVICE_MODELS[hypervisor_type]
    return {
        "start": False,
        "hypervisor": hypervisor_type,
        "seed": False,  # the identity travels on the seed CD-ROM, not by guestfs
        "disk": None,
        "disks": [{"name": "system", "device": "disk", "source_file": disk_path,
                   "format": "qcow2", "model": models.disk},
                  {"name": "data", "device": "disk", "source_file": data_path,
                   "format": "raw", "model": models.disk},
                  {"name": "seed", "device": "cdrom", "source_file": seed_path,
                   "format": "raw", "model": models.seed}],
        "nic": None,
        "interfaces": interfaces_for(store.vm.network, models),
        "graphics": {"type": "vnc", "listen": {"type": "address", "address": "127.0.0.1"}},
        "serials": [{"type": "pty"}],
        "consoles": [{"type": "pty"}],
        "boot_dev": "hd",
    }


def domain_xml(store: Store, hypervisor_type: str, images_dir: str) -> str:
    """The domain XML step 5's virt.init defines for `store` on a `hypervisor_type` host, made
    by the virt module's own generator (saltext-virt's, as Salt 3006's) from init_kwargs().

    It runs here, not on the hypervisor: libvirt's in-process test driver stands in for the
    connection (the generator only reads storage-pool capabilities from it) and the paths are
    the hypervisor's."""
    import libvirt
    from saltext.virt.modules import virt as virt_module

    paths = vm_paths(store, images_dir)
    kwargs = init_kwargs(store, hypervisor_type, paths["disk"], paths["seed"], paths["data"])
    # the loader's dunders, as a minion would have them; os_family matters only for Xen PV
    virt_module.__grains__ = {"os_family": "Suse"}
    virt_module.__salt__ = {"config.get": lambda _key, default=None: default}
    virt_module.__opts__ = {}
    conn = libvirt.open("test:///default")
    try:
        nics = virt_module._get_merged_nics(hypervisor_type, kwargs["nic"], kwargs["interfaces"])
        return str(virt_module._gen_xml(
            conn, store.vm_name, store.vm.vcpus, store.vm.memory_mib, kwargs["disks"], nics,
            hypervisor_type, "hvm", "x86_64", graphics=copy.deepcopy(kwargs["graphics"]),
            boot_dev=kwargs["boot_dev"], serials=copy.deepcopy(kwargs["serials"]),
            consoles=copy.deepcopy(kwargs["consoles"])))
    finally:
        conn.close()
