"""The lab's state dir and `lab.json`, the file that describes a running lab."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, Field, field_validator

from lab.approvers import LAB_APPROVERS_BLOCK
from lab.ports import PORTS_FILE
from lab.procs import ProcessRecord
from store_rollout.private_files import write_private

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STATE_DIR = REPO_ROOT / ".lab"
SALT_STATES_DIR = REPO_ROOT / "salt_states"
# what only the lab's master serves, ahead of salt_states/ (lab/salt_overlay/README.md)
SALT_OVERLAY_DIR = REPO_ROOT / "lab" / "salt_overlay"
LAB_FILE_ROOTS = (SALT_OVERLAY_DIR, SALT_STATES_DIR)
IMAGE_BUILDS_DIR = REPO_ROOT / "image_builds"
# the lab's own KIWI descriptions, beside the shipped ones but not among them
LAB_IMAGE_BUILDS_DIR = REPO_ROOT / "lab" / "image_builds"
# what the lab's store VMs boot (the full lab builds it; the default lab simulates its guest)
LAB_IMAGE_DESCRIPTION = LAB_IMAGE_BUILDS_DIR / "lab-debian"
# the Prefect Secret blocks of the lab's Cobbler password and ERP token (named by the settings)
COBBLER_PASSWORD_BLOCK = "lab-cobbler-password"
ERP_TOKEN_BLOCK = "lab-erp-token"
REGISTRATION_CODE_BLOCK = "lab-registration-code"
# where the lab's SLES hosts register: nothing answers there (the lab's installers only read the
# profile), and .invalid never resolves
LAB_REGISTRATION_URL = "https://rmt.lab.invalid"
VENV_BIN = Path(os.environ.get("STORE_ROLLOUT_VENV", REPO_ROOT / ".venv")) / "bin"
# the Salt a sles15-xen store host runs: upstream 3006.30 (3006 line, built-in virt module, auth
# protocol 3), standing in for SUSE's salt 3006.0-150500.4.65.1 (3006.0 with SUSE's backports,
# protocol 3 and minimum_auth_version among them), which is not on PyPI; the VMs' minions and the
# master run the project's Salt (VENV_BIN)
HOST_SALT_BIN = Path(os.environ.get("STORE_ROLLOUT_HOST_SALT_VENV",
                                    REPO_ROOT / ".venv-salt3006")) / "bin"
# Leap 15.6's own salt-minion: Salt 3006.0 on Python 3.6.15 (auth protocol 2, which the lab's
# master refuses): the simulator installs a host with it on request (fault knob old_host_salt)
HOST_PY36_SALT_BIN = Path(os.environ.get("STORE_ROLLOUT_HOST_PY36_VENV",
                                         REPO_ROOT / ".venv-host-py36")) / "bin"
# the Salt each platform's store host runs in the lab, by the platform its install profile names
# (grain store_rollout_platform): sles15-xen HOST_SALT_BIN; sle16-kvm the project's Salt 3008.3 on
# Python 3.11 (VENV_BIN, with saltext-virt), standing in for SUSE's Salt Bundle the Agama profile
# installs (venv-salt-minion: 3006.0 with SUSE's backports on its own Python 3.11), which is not
# on PyPI either
PLATFORM_SALT_BIN = {"sles15-xen": HOST_SALT_BIN, "sle16-kvm": VENV_BIN}
# the OS a simulated host of each platform reports (grains osfullname and osrelease, as SLES
# sets them from /etc/os-release; reconcile reads them): the lab's Debian would say otherwise
PLATFORM_OS_GRAINS = {"sles15-xen": {"osfullname": "SLES", "osrelease": "15.7"},
                      "sle16-kvm": {"osfullname": "SLES", "osrelease": "16.0"}}
COBBLER_VENV = Path(os.environ.get("STORE_ROLLOUT_COBBLER_VENV", REPO_ROOT / ".venv-cobbler"))


def state_dir_from_env(explicit: Path | None = None) -> Path:
    """The lab state dir: explicit argument, then STORE_ROLLOUT_LAB_DIR, then `.lab/`."""
    if explicit is not None:
        return explicit.resolve()
    env = os.environ.get("STORE_ROLLOUT_LAB_DIR")
    return Path(env).resolve() if env else DEFAULT_STATE_DIR


class ServiceInfo(BaseModel):
    """One lab daemon: how to reach it and the process the lab started for it."""

    address: str
    pid: int
    create_time: float
    log: str

    @property
    def record(self) -> ProcessRecord:
        return ProcessRecord(self.pid, self.create_time)


class LabPorts(BaseModel):
    postgres: int
    prefect: int
    salt_publish: int
    salt_ret: int
    cobbler_xmlrpc: int
    cobbler_http: int
    erp: int
    simulator: int
    image_server: int = 0  # 0: allocated on the next `lab up` (a lab state dir from before)
    vbmcd: int = 0  # VirtualBMC's control port
    redfish: int = 0  # the Redfish BMC emulator
    webhook: int = 0  # the lab's chat channel (lab/webhook_receiver.py)
    # the second region's Salt master (`lab up --regions 2`): allocated, and forwarded to the
    # store network, in every lab, so a second region comes up without a new gateway
    region2_salt_publish: int = 0
    region2_salt_ret: int = 0
    # the region's backup target (lab/backup_server.py): the stores' endpoint (forwarded to the
    # store network) and the admin one (loopback only)
    backup: int = 0
    backup_admin: int = 0


class LabSecrets(BaseModel):
    """Generated once per state dir; lab-only credentials, never the vendor defaults."""

    postgres_password: str = Field(default_factory=lambda: secrets.token_hex(12))
    cobbler_user: str = "lab-admin"
    cobbler_password: str = Field(default_factory=lambda: secrets.token_urlsafe(18))
    erp_token: str = Field(default_factory=lambda: secrets.token_urlsafe(24))
    bmc_user: str = "lab-bmc"
    # 20 characters: IPMI 2.0 takes at most 20 bytes (a lab from before had 24: made anew)
    bmc_password: str = Field(default_factory=lambda: secrets.token_urlsafe(15))

    @field_validator("bmc_password")
    @classmethod
    def _ipmi_sized(cls, value: str) -> str:
        return value if len(value) <= 20 else secrets.token_urlsafe(15)


class LabInfo(BaseModel):
    """Contents of `<state>/lab.json`; the flows' settings can be loaded from it."""

    state_dir: str
    prefect_api_url: str
    prefect_ui_url: str
    # the API's TLS (the lab CA clients verify with) and basic auth (a 0600 file of
    # user:password): lab/prefect_access.py; "" in a lab.json from before
    prefect_ca_file: str = ""
    prefect_auth_file: str = ""
    postgres_url: str
    salt_master_config: str
    # what the simulated store hosts and VMs use: the store network's gateway, which forwards
    # to the services on the orchestrator's loopback (lab/store_network.py)
    salt_master_address: str = "127.0.0.1"
    salt_publish_port: int
    salt_ret_port: int
    cobbler_url: str
    cobbler_http_url: str
    cobbler_user: str
    cobbler_password: str
    # the store hosts' BMC emulators (lab/bmc_service.py) and their login, which the flows get
    # from the BMC Credentials Block `bmc_block` (lab up saves it on the lab's Prefect server)
    bmc_user: str = ""
    bmc_password: str = ""
    bmc_block: str = "lab-bmc"
    redfish_url: str = ""
    vbmcd_port: int = 0
    vbmc_dir: str = ""
    # the notifications' channel: a webhook receiver, and the notification block that names
    # it (lab up saves it; the flows' settings name it)
    notify_url: str = ""
    notify_log: str = ""
    notify_block: str = "custom-webhook/lab-notify"  # <block type>/<name>, as Prefect names it
    libvirt_uri: str
    erp_url: str
    erp_token: str
    erp_log: str
    simulator_url: str
    image_cache_dir: str
    image_base_url: str = ""  # the image cache over HTTP, as store hosts reach it; "" before `lab up`
    image_server_url: str = ""  # the same server on the orchestrator's loopback (its /_lab knobs)
    store_network_state: str = ""  # the store network gateway's state file (lab.store_network)
    vm_images_dir: str
    # full lab (`lab up --full`): the store VM boots the KIWI-built image under QEMU (KVM when
    # the host offers it, vm_type "kvm"; else TCG, "qemu") and runs its own minion and firstboot
    full: bool = False
    vm_type: str = "qemu"
    # `lab up --regions 2`: a second region (lab/regions.py), its own Salt master and worker
    regions: int = 1
    regions_file: str = ""
    region2_salt_master_config: str = ""
    region2_salt_publish_port: int = 0
    region2_salt_ret_port: int = 0
    # the backup target (issue 48, lab/backup_server.py): the stores' URL (at the gateway), the
    # admin one (loopback), the CA that verifies both, and the Backup Credentials Block's name
    backup_url: str = ""
    backup_admin_url: str = ""
    backup_ca_file: str = ""
    backup_block: str = "lab-backup"
    services: dict[str, ServiceInfo] = Field(default_factory=dict)


class LabPaths:
    """Where each part of the lab lives inside the state dir."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lab_json = root / "lab.json"
        # the flows' settings, as any deployment hands them over (STORE_ROLLOUT_SETTINGS_FILE)
        self.settings_file = root / "settings.env"
        self.ports_json = root / PORTS_FILE
        self.secrets_json = root / "secrets.json"
        self.logs = root / "logs"
        self.postgres = root / "postgres"
        self.prefect_home = root / "prefect-home"
        self.prefect_auth = root / "prefect-auth"  # user:password, 0600 (lab/prefect_access.py)
        self.prefect_tls = root / "prefect-tls"
        self.salt = root / "salt"
        self.salt_region2 = root / "salt-region2"
        self.regions_file = root / "regions.yaml"
        self.cobbler = root / "cobbler"
        self.libvirt = root / "libvirt"
        self.erp = root / "erp"
        self.simulator = root / "simulator"
        # machine id -> index of its store network address (lab.store_network.machine_address)
        self.machine_addresses = self.simulator / "addresses.json"
        self.image_cache = root / "image-cache"
        self.store_network = root / "store-network"
        self.bmc = root / "bmc"

    @property
    def master_config(self) -> Path:
        return self.salt / "etc" / "master" / "master"

    def load_info(self) -> LabInfo | None:
        if not self.lab_json.exists():
            return None
        return LabInfo.model_validate_json(self.lab_json.read_text())

    def write_info(self, info: LabInfo) -> None:
        # both 0600 from their creation: lab.json holds lab credentials, and load_settings
        # refuses a settings file others may read
        write_private(self.lab_json, info.model_dump_json(indent=2))
        write_private(self.settings_file, "".join(
            f"{name}='{_dotenv_value(name, value)}'\n"
            for name, value in flow_settings(info, self.root).items()))

    def load_or_create_ports(self) -> LabPorts:
        """The lab's ports as recorded; the missing ones chosen (lab/ports.py says how) and
        recorded under the lock the sibling labs choose theirs under."""
        from lab import ports

        values: dict[str, int] = {}
        if self.ports_json.exists():
            values = LabPorts.model_validate_json(self.ports_json.read_text()).model_dump()
            if all(values.values()):
                return LabPorts(**values)
        self.root.mkdir(parents=True, exist_ok=True)
        with ports.labs_locked(self.root.parent):
            chosen = LabPorts(**ports.choose(LabPorts.model_fields, self.root, values))
            self.ports_json.write_text(chosen.model_dump_json(indent=2))
        return chosen

    def load_or_create_secrets(self) -> LabSecrets:
        if self.secrets_json.exists():
            raw = json.loads(self.secrets_json.read_text())
            stored = LabSecrets.model_validate(raw)
            if stored.model_fields_set == set(LabSecrets.model_fields) \
                    and stored.model_dump() == raw:  # none made anew by a validator
                return stored
            created = stored  # an older lab: keep its secrets, persist the new ones once
        else:
            created = LabSecrets()
        write_private(self.secrets_json, created.model_dump_json(indent=2))
        return created


def running_labs(homes: tuple[Path, ...] | None = None) -> list[Path]:
    """Labs running on this machine where labs live by default: `.lab` (`lab up`) and `.lab-*`
    (the tests' `.lab-test*`) in the checkout and in the current directory. A lab runs when a
    process its lab.json records is alive. Only ever named to a person (the CLI's hint when
    settings are missing), never used by itself."""
    found: list[Path] = []
    for home in dict.fromkeys(h.resolve() for h in (homes or (REPO_ROOT, Path.cwd()))):
        for state_dir in sorted(home.glob(".lab*")):
            if state_dir not in found and _lab_alive(state_dir / "lab.json"):
                found.append(state_dir)
    return found


def _lab_alive(lab_json: Path) -> bool:
    try:
        services = json.loads(lab_json.read_text()).get("services") or {}
        records = [ProcessRecord.from_json(s) for s in services.values()]
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return False  # no lab.json, or not one a lab wrote
    return any(record.alive() for record in records)


# the lab's image versions (settings image_versions): versions of the lab's own image
LAB_IMAGE_VERSIONS: Final[dict[str, Any]] = {"v1": {"notes": "the store server image of the lab"},
                             "v2": {"notes": "the same image, a version later (update tests)"}}


def flow_settings(info: LabInfo, root: Path) -> dict[str, str]:
    """What the lab hands the flows and the CLI: STORE_ROLLOUT_* settings of its services and the
    Prefect server a client of the lab talks to."""
    return {
        "STORE_ROLLOUT_COBBLER_URL": info.cobbler_url, "STORE_ROLLOUT_COBBLER_USER": info.cobbler_user,
        # secrets only in Blocks (lab up saves them, lab/prefect_server.save_secret_blocks)
        "STORE_ROLLOUT_COBBLER_PASSWORD_BLOCK": COBBLER_PASSWORD_BLOCK,
        "STORE_ROLLOUT_SALT_MASTER_CONFIG": info.salt_master_config,
        "STORE_ROLLOUT_SALT_MASTER_ADDRESS": info.salt_master_address,
        "STORE_ROLLOUT_SALT_PUBLISH_PORT": str(info.salt_publish_port),
        "STORE_ROLLOUT_SALT_RET_PORT": str(info.salt_ret_port),
        "STORE_ROLLOUT_HYPERVISOR_LIBVIRT_URI": info.libvirt_uri,
        "STORE_ROLLOUT_VM_TYPE": info.vm_type, "STORE_ROLLOUT_VM_IMAGES_DIR": info.vm_images_dir,
        # the chain's platform for stores whose inventory names none (the example names each)
        "STORE_ROLLOUT_HYPERVISOR_PLATFORM": "sles15-xen",
        "STORE_ROLLOUT_REGISTRATION_URL": LAB_REGISTRATION_URL,
        "STORE_ROLLOUT_REGISTRATION_CODE_BLOCK": REGISTRATION_CODE_BLOCK,
        "STORE_ROLLOUT_ERP_URL": info.erp_url, "STORE_ROLLOUT_ERP_TOKEN_BLOCK": ERP_TOKEN_BLOCK,
        "STORE_ROLLOUT_BMC_CREDENTIALS_BLOCK": info.bmc_block,
        "STORE_ROLLOUT_NOTIFICATION_BLOCK": info.notify_block,
        # the lab's approvers' seeds (lab/approvers.py) and the audit trail, in the state dir
        "STORE_ROLLOUT_APPROVERS_BLOCK": LAB_APPROVERS_BLOCK,
        "STORE_ROLLOUT_AUDIT_DIR": str(root / "audit"),
        # a decommission's data disk exports (tasks/data_export.py)
        "STORE_ROLLOUT_DATA_EXPORT_DIR": str(root / "data-exports"),
        # the master's libvirt CA: the boxes' TLS trust for a hardware refresh (issue 48)
        "STORE_ROLLOUT_LIBVIRT_CA_DIR": str(root / "libvirt-ca"),
        # the operators hear of a host not ready this long after its power-on: Prefect's
        # minimum for the default lab's seconds-long installs, the full lab's take about 50 s
        "STORE_ROLLOUT_HYPERVISOR_READY_EXPECTED_SECONDS": "120" if info.full else "10",
        # the simulated guest's units start with its minion; the real one's may start after it
        "STORE_ROLLOUT_GO_LIVE_SETTLE_SECONDS": "60" if info.full else "6",
        # a store whose link is cut after step 5 is waited for this long (production: an hour)
        "STORE_ROLLOUT_STORE_LINK_WAIT_SECONDS": "600",
        # a killed lab run is marked Crashed 18 s after its last beat, not 90 s: its tests do
        # not wait out production's window (three missed beats still)
        "STORE_ROLLOUT_HEARTBEAT_SECONDS": "6",
        # the chain's default calendar: the lab's stores may be disrupted at any hour (a store
        # without a calendar and a chain without this would have its disruptive steps refused)
        "STORE_ROLLOUT_DEFAULT_TIME_ZONE": "UTC",
        "STORE_ROLLOUT_DEFAULT_MAINTENANCE_WINDOWS": "daily 00:00-24:00",
        # a host's domain has no power supply to drain: no pause needed
        "STORE_ROLLOUT_POWER_OFF_SECONDS": "0",
        # the default lab's hosts have no OS to answer the ACPI power button: a decommission's
        # graceful shutdown is asked for, and the power cut after 2 s
        "STORE_ROLLOUT_GRACEFUL_SHUTDOWN_SECONDS": "2",
        # the full lab boots a real image; the default lab's guests are simulated processes
        "STORE_ROLLOUT_IMAGE_DESCRIPTION": str(LAB_IMAGE_DESCRIPTION),
        "STORE_ROLLOUT_IMAGE_BUILDER": "kiwi" if info.full else "lab",
        "STORE_ROLLOUT_IMAGE_CACHE_DIR": info.image_cache_dir,
        "STORE_ROLLOUT_IMAGE_BASE_URL": info.image_base_url,
        "STORE_ROLLOUT_IMAGE_PARAMS": json.dumps({"SALT_MASTER": info.salt_master_address,
                                                  "SALT_MASTER_PORT": str(info.salt_ret_port)}),
        # two image versions of the lab's image (issue 47: `store-rollout update STORE --image
        # v2`): the same description, built with IMAGE_VERSION v1 or v2 (two image keys, the
        # VM's grain says which); the chain's stores run v1
        "STORE_ROLLOUT_IMAGE_VERSIONS": json.dumps(LAB_IMAGE_VERSIONS),
        "STORE_ROLLOUT_IMAGE_VERSION": "v1",
        "PREFECT_API_URL": info.prefect_api_url,
        "PREFECT_HOME": str(root / "prefect-client-home"),
        # the API's CA, and the file of its credential (the settings file holds no secret)
        "PREFECT_API_SSL_CERT_FILE": info.prefect_ca_file,
        "STORE_ROLLOUT_PREFECT_AUTH_FILE": info.prefect_auth_file,
        # the lab's regions (a second one with `lab up --regions 2`); a process serves the
        # default region unless its STORE_ROLLOUT_REGION names another
        **({"STORE_ROLLOUT_REGIONS_FILE": info.regions_file} if info.regions_file else {}),
        # the region's backup target (lab/backup_server.py); its secrets in the Block
        **({"STORE_ROLLOUT_BACKUP_URL": info.backup_url,
            "STORE_ROLLOUT_BACKUP_CA_FILE": info.backup_ca_file,
            "STORE_ROLLOUT_BACKUP_CREDENTIALS_BLOCK": info.backup_block}
           if info.backup_url else {}),
    }


def _dotenv_value(name: str, value: str) -> str:
    """A value that a single-quoted dotenv line carries literally."""
    if "'" in value or "\n" in value:
        raise ValueError(f"{name}: {value!r} cannot be written to a settings file as it is")
    return value


def load_lab_info(state_dir: Path | None = None) -> LabInfo:
    """Read lab.json of a running lab, or explain how to start one."""
    paths = LabPaths(state_dir_from_env(state_dir))
    info = paths.load_info()
    if info is None:
        raise FileNotFoundError(
            f"no lab at {paths.root}: run `store-rollout lab up` first (lab.json missing)"
        )
    return info

