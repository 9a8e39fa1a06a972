"""The lab's second region (`lab up --regions 2`): its own Salt master, with its own keys,
autosign tokens and event forwarding to the lab's one Prefect server, and its own worker on its
own work pool. Its stores share the store network, libvirtd and Cobbler with the default
region's (a second DHCP server on one network would answer the same PXE requests): the lab
separates what the regions must not share, the master and the worker that talks to it."""

from __future__ import annotations

import yaml

from lab.state import LabInfo, LabPaths, LabPorts
from lab.store_network import GATEWAY

SECOND_REGION = "r2"
SECOND_POOL = "rollout-r2"
SECOND_MASTER = "salt-master-r2"
SECOND_WORKER = "prefect-worker-r2"
SECOND_MASTER_ID = "lab-master-r2"


def describe(info: LabInfo, paths: LabPaths, ports: LabPorts, regions: int) -> None:
    """`info`'s regions, and the regions file its settings name (none for one region)."""
    if regions not in (1, 2):
        raise ValueError(f"--regions {regions}: the lab runs 1 or 2 regions")
    info.regions = regions
    if regions == 1:
        info.regions_file = ""
        info.region2_salt_master_config = ""
        info.region2_salt_publish_port = info.region2_salt_ret_port = 0
        paths.regions_file.unlink(missing_ok=True)
        return
    info.region2_salt_master_config = str(paths.salt_region2 / "etc" / "master" / "master")
    info.region2_salt_publish_port = ports.region2_salt_publish
    info.region2_salt_ret_port = ports.region2_salt_ret
    second = {
        "salt_master_config": info.region2_salt_master_config,
        "salt_master_address": GATEWAY,
        "salt_publish_port": ports.region2_salt_publish,
        "salt_ret_port": ports.region2_salt_ret,
        # the region's VM image dials its own master (its own cache entry)
        "image_params": {"SALT_MASTER": GATEWAY, "SALT_MASTER_PORT": str(ports.region2_salt_ret)},
    }
    paths.regions_file.write_text(yaml.safe_dump({"regions": {
        "default": {"work_pool": "rollout-pool"},
        SECOND_REGION: {"work_pool": SECOND_POOL, "settings": second}}}, sort_keys=False))
    info.regions_file = str(paths.regions_file)


def publish_port_of(ports: LabPorts, ret_port: int | None) -> tuple[int, int]:
    """(ret, publish) port of the lab master a machine dials on `ret_port` (the default
    region's when it names none): a lab master publishes on a port of its own, where a real
    one uses 4505 beside its 4506."""
    if ret_port and ret_port == ports.region2_salt_ret:
        return ports.region2_salt_ret, ports.region2_salt_publish
    return ports.salt_ret, ports.salt_publish
