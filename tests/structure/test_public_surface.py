"""Each package's public surface, pinned (as httpx pins its own): what other packages may import
from it. A name added to or dropped from a package's `__init__` fails here until this list says
so; a name no other package uses belongs in its module, not in the list."""

from __future__ import annotations
import __future__

import importlib
import types

import pytest

SURFACES = {
    "tasks": ["CLIENTS", "HELPERS", "STEP_MODULES"],
    "store_rollout.inventory": [
        "DEFAULT_INVENTORY", "InventoryError", "Store", "load_inventory", "parse_inventory",
    ],
    "tasks.bmc": [
        "Bmc", "BmcAuthFailed", "BmcCredentials", "BmcError", "BmcRejected", "BmcUnreachable",
        "IpmiBmc", "RedfishBmc", "bmc_client", "bmc_credentials", "bmc_problems",
        "power_cycle_for_install", "power_off_hypervisor",
    ],
    "tasks.cobbler": [
        "CobblerAuthError", "CobblerClient", "CobblerCredentials", "CobblerError",
        "CobblerNotFound", "CobblerRejected", "CobblerUnavailable", "SystemSpec",
        "cobbler_client", "disable_hypervisor_netboot", "forget_install_secrets",
        "power_cycled_at", "record_fields", "remove_hypervisor_record", "spec_fields",
        "system_changes", "system_spec",
    ],
    "tasks.kiwi": [
        "BUILD_PARAMS_FILE", "BuildOutput", "BuildParamsError", "IDENTITY_SCRIPT",
        "IMAGE_BUILDS_DIR", "ImageCache", "KiwiBuildError", "KiwiBuildTimeout", "KiwiBuilder",
        "KiwiDescriptionError", "OBS_REPOSITORIES", "ensure_image", "image_key", "image_status",
        "kiwi_profile", "local_repo_args", "make_builder", "minion_d_dir", "resolve_description",
        "resolve_params", "substitute", "validate_description",
    ],
}


def public_names(module: types.ModuleType) -> set[str]:
    """What the package's namespace offers besides its submodules and `from __future__`."""
    return {name for name, value in vars(module).items()
            if not name.startswith("_") and not isinstance(value, types.ModuleType)
            and not isinstance(value, __future__._Feature)}


@pytest.mark.parametrize("package", sorted(SURFACES))
def test_exported_names(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(SURFACES[package])
    assert public_names(module) == set(SURFACES[package]), "exported but not in __all__"


def test_the_check_sees_an_unlisted_name() -> None:
    planted = types.ModuleType("planted")
    exec("from __future__ import annotations\nimport os\nX = 1\n_y = 2\n", vars(planted))
    assert public_names(planted) == {"X"}
