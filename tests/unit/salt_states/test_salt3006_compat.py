"""The hypervisor minion of a Leap 15.6 store runs the distribution's Salt 3006 (SUSE's
3006.0 with backports) with Salt's built-in `virt` module. The lab's hypervisor minions run
upstream 3006.30; this test reads the virt module of Salt 3006.0's own source (`make setup`
downloads the sdist, checksum verified) and checks that every virt function and argument the
pipeline uses exists there with the same name, so the oldest 3006 agrees too.
"""

from __future__ import annotations

import ast
import os
import tarfile
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from store_rollout.inventory import parse_inventory
from tasks import vm_domain as virt

SDIST = Path(os.environ.get("STORE_ROLLOUT_SALT3006_SDIST",
                            REPO_ROOT / ".cache" / "salt-3006.0.tar.gz"))
# each virt function the pipeline calls on a hypervisor, with its positional arguments
CALLS = {"init": ["name", "cpu", "mem"], "start": ["name"]}


@pytest.fixture(scope="module")
def virt_3006() -> tuple[dict[str, ast.FunctionDef], str]:
    if not SDIST.exists():
        pytest.fail(f"{SDIST} missing: `make setup` downloads Salt 3006.0's sdist")
    with tarfile.open(SDIST) as sdist:
        member = sdist.extractfile("salt-3006.0/salt/modules/virt.py")
        assert member is not None
        source = member.read().decode()
    functions = {node.name: node for node in ast.parse(source).body
                 if isinstance(node, ast.FunctionDef)}
    return functions, source


def init_kwargs(network: str, hypervisor: str) -> dict[str, object]:
    store = parse_inventory({"stores": [{
        "store_id": "s1", "erp": {"site_code": "S1"}, "vm": {"network": network},
        "hypervisor": {"hostname": "hv-s1.example", "mac": "52:54:00:00:00:01"}}]}).get("s1")
    return virt.init_kwargs(store, hypervisor, "/srv/salt-images/s1/system.qcow2",
                            "/srv/salt-images/s1/seed.iso", "/srv/salt-images/s1/data.raw")


@pytest.mark.parametrize("hypervisor", ["xen", "kvm"])
@pytest.mark.parametrize("network", ["br0", "none"])
def test_every_virt_call_exists_in_salt_3006(virt_3006: tuple[dict[str, ast.FunctionDef], str],
                                             network: str, hypervisor: str) -> None:
    functions, source = virt_3006
    for name, positional in CALLS.items():
        assert name in functions, f"Salt 3006's virt module has no {name}"
        params = [a.arg for a in functions[name].args.args]
        assert params[:len(positional)] == positional, (name, params)
    kwargs = init_kwargs(network, hypervisor)
    init_params = {a.arg for a in functions["init"].args.args}
    # init takes **kwargs: an unknown name would be ignored silently, so each must be a parameter
    assert set(kwargs) <= init_params, set(kwargs) - init_params
    disk_keys = {k for disk in kwargs["disks"] for k in disk}  # type: ignore[attr-defined]
    nic_keys = {k for nic in kwargs["interfaces"] for k in nic}  # type: ignore[attr-defined]
    for key in sorted(disk_keys | nic_keys | set(kwargs["graphics"])):  # type: ignore[arg-type]
        assert f'"{key}"' in source, f"Salt 3006's virt module never reads {key!r}"


def test_salt_3006_maps_disk_models_and_cdroms_as_the_pipeline_expects(
        virt_3006: tuple[dict[str, ast.FunctionDef], str]) -> None:
    """tasks.virt.DEVICE_MODELS relies on the generator's disk model -> bus/target mapping and
    on a CD-ROM keeping its model and needing no image: the same in 3006 as in saltext-virt."""
    _functions, source = virt_3006
    assert 'disk_bus_map = {"virtio": "vd", "xen": "xvd", "fdc": "fd", "ide": "hd"}' in source
    assert 'if disk.get("device", "disk") == "cdrom" and "model" not in disk:' in source
    assert 'if _disk.get("device", "disk") == "cdrom":\n                continue' in source
