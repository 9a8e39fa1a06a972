"""String contracts between the orchestrator and what runs elsewhere: Salt states and modules
on the master and minions, the image's minion.d files and shell scripts, the AutoYaST profile.

This module is the one Python spelling of each value; Python code imports it. The other sides
cannot import Python (a minion has no store_rollout package, a shell script none at all), so
they keep their own spelling, and tests/structure/test_contracts.py fails when one differs from
this. Change a value here, then in the files the test names.
"""

from __future__ import annotations

from typing import Final

# -- autosign --------------------------------------------------------------------------------
# The one grain the master's autosign_grains_dir matches at key authentication: the master
# holds the one-time tokens in `autosign_grains_dir/<AUTOSIGN_GRAIN>` (tasks/salt/tokens.py,
# lab/salt_master.py); a minion sends it because its minion config lists it in
# `autosign_grains` (image: minion.d/20-autosign.conf; hypervisor: the AutoYaST profile, which
# gets it as Cobbler meta `autosign_grain`) and sets it from its token (image: store-identity
# writes it to 15-identity.conf; hypervisor: the AutoYaST profile's grains file).
AUTOSIGN_GRAIN: Final = "store_rollout_token"
# beside the master's autosign_grains_dir: {minion id: its outstanding one-time token}, written
# by the pipeline (tasks/salt/tokens.py) and read by the master's store_autosign_guard engine
TOKEN_MAP_FILE: Final = "store_rollout_tokens.json"
# the guard's event when a minion signed in with a token issued for another id (key removed)
AUTOSIGN_REFUSED_TAG: Final = "store/autosign/refused"
# the guard's event when a salt/auth accept event is not backed by the master's own key files
# (no such accepted key, another public key, or a key accepted long before): a minion forged it;
# the guard did nothing else
AUTOSIGN_FORGED_TAG: Final = "store/autosign/forged"

# -- install profile inputs ------------------------------------------------------------------
# Cobbler autoinstall_meta keys step 2 (tasks/cobbler/systems.system_spec) sets and each
# platform's profile (image_builds/autoyast/, image_builds/agama/) reads with $getVar;
# tests/lab/test_lab_cobbler.py renders the profiles with them in a real Cobbler.
# crypt(3) SHA-512 of root's password (its Prefect Secret block); without it root is locked
ROOT_PASSWORD_HASH_META: Final = "root_password_hash"
# the update repositories, space-separated `alias=url` (settings.hypervisor_update_repos)
UPDATE_REPOS_META: Final = "update_repos"
# when step 2 powered the host on into its install (UTC, ISO 8601): a rerun within the install's
# time finds it and does not power-cycle a host in the middle of its install; no template reads it
POWER_CYCLED_META: Final = "install_power_cycled_at"
# the host's one-time autosign token (the profile writes it as the AUTOSIGN_GRAIN grain)
AUTOSIGN_TOKEN_META: Final = "autosign_token"
# the master's public key fingerprint the profile pins as the minion's `master_finger`
MASTER_FINGER_META: Final = "master_finger"
# the master's hash_type: the minion computes the fingerprint in its own, so the profile sets it
MASTER_HASH_TYPE_META: Final = "master_hash_type"
# the store's platform (store_rollout/platforms.py): the profile writes it as the grain
# STORE_PLATFORM_GRAIN, and the hypervisor formula takes parameters/platform/<it>.yaml
STORE_PLATFORM_META: Final = "store_platform"
STORE_PLATFORM_GRAIN: Final = "store_rollout_platform"
# the installer's product id (AutoYaST: SLES; Agama: SLES or Leap_16.0)
INSTALL_PRODUCT_META: Final = "install_product"
# where a SLES host registers (settings registration_url) and its code (a Secret block's value)
REGISTRATION_URL_META: Final = "registration_url"
REGISTRATION_CODE_META: Final = "registration_code"
# Xen dom0's memory (inventory hypervisor.dom0_mem; sles15-xen only)
DOM0_MEM_META: Final = "dom0_mem"
# what an installed host's record no longer holds (step 4 removes them, once step 3 saw the
# host ready): Cobbler serves a record's profile to anyone who asks for it by name
INSTALL_SECRETS_META: Final = (AUTOSIGN_TOKEN_META, ROOT_PASSWORD_HASH_META,
                               REGISTRATION_CODE_META)

# -- image delivery ----------------------------------------------------------------------------
# storevirt.ensure_base_image's failure text when the image server's answer stopped midway; the
# orchestrator (tasks/image_delivery.py) classifies that failure as ImageDownloadCut, once, and
# resumes the download on that type.
DOWNLOAD_CUT: Final = "download cut"

# -- custom modules on a minion -----------------------------------------------------------------
# the files saltutil.sync_<form> copies (salt.utils.extmods' include pattern) and the forms step 4
# keeps current on a hypervisor (utils first: storevirt reaches them through __utils__);
# storevirt.extension_hashes and tasks/salt/extensions.py hash the same files
SYNCED_EXTENSION_PATTERN: Final = r"\.(pyx?|so|zip)$"
HYPERVISOR_EXTENSION_FORMS: Final = ("utils", "modules")

# -- hypervisor ready ------------------------------------------------------------------------
# The last state of a hypervisor's highstate sets this grain and fires this event
# (salt_states/hypervisor/ready via parameters/defaults.yaml `ready:`); step 3
# (tasks/salt_master.wait_for_hypervisor, its watcher in tasks/salt/watchers.py) waits for the
# event and probes the grain.
HYPERVISOR_READY_TAG: Final = "store/hypervisor/ready"
HYPERVISOR_READY_GRAIN: Final = "store_rollout_hypervisor_ready"
# The bridge addressing AutoYaST gave the hypervisor (its profile writes the grain; the
# hypervisor formula's map.jinja reads it for its checks).
BRIDGE_GRAIN: Final = "store_rollout_bridge"
# Salt's core grain of the machine's SMBIOS serial number (sysfs or dmidecode): step 3 compares
# it with the inventory's hypervisor.serial before anything else is done on the host.
HARDWARE_SERIAL_GRAIN: Final = "serialnumber"

# -- hypervisor domain events ----------------------------------------------------------------
# The store_libvirt_events engine on each hypervisor (salt_states/_engines: Salt's libvirt_events
# callbacks on a connection it keeps) sends its store VMs' lifecycle events (started, stopped,
# crashed) to the master as `<LIBVIRT_EVENT_TAG_PREFIX>/<uri>/domain/lifecycle`; the
# master's store_prefect_events engine forwards them to Prefect. The engine's minion.d file:
# AutoYaST writes it at install (so the first minion start runs the engine) and the hypervisor
# formula's `events` concern manages the same file (defaults.yaml `events:`); test_salt_render
# checks both write the same text. AutoYaST also writes the engine module itself into the
# minion's extension modules, from the Cobbler snippet `<LIBVIRT_EVENTS_ENGINE>.py` (a copy of
# the module); highstates sync it from `_engines`.
LIBVIRT_EVENTS_CONF: Final = "60-libvirt-events.conf"
LIBVIRT_EVENT_TAG_PREFIX: Final = "store/libvirt"
LIBVIRT_EVENTS_ENGINE: Final = "store_libvirt_events"
# The engine's own events, `<LIBVIRT_EVENT_TAG_PREFIX>/<uri>/<suffix>`: its connection to libvirt
# lost (the daemon restarted or stopped answering) and restored (with the domains' states);
# store_prefect_events forwards them as `salt.store.libvirt.connection.lost|restored`.
LIBVIRT_CONNECTION_LOST: Final = "connection/lost"
LIBVIRT_CONNECTION_RESTORED: Final = "connection/restored"
# The field of each such event's body that holds its signature ({"time", "value"}): the
# hypervisor engine signs tag, minion id, body and time with its own minion key, and
# store_prefect_events forwards only what the claimed id's accepted key verifies (a batch event
# on the master's bus carries whatever id its sender wrote).
STORE_EVENT_SIGNATURE: Final = "signature"

# -- store VM firstboot ----------------------------------------------------------------------
# The image's bootstrap minion.d file runs this sls at minion start (startup_states).
FIRSTBOOT_SLS: Final = "provisioning_helper.firstboot"
# The VM's progress through firstboot across reboots, kept in a grain: init.sls includes
# `provisioning_helper.firstboot.<stage>` (one sls per stage, in this order, each setting the
# next); step 6 (tasks/firstboot.py) and the lab checks read the grain. A VM without the grain
# is at the first stage.
FIRSTBOOT_STAGE_GRAIN: Final = "firstboot_stage"
FIRSTBOOT_STAGES: Final = ("new", "highstate", "verify", "done")
FIRSTBOOT_STAGE_NEW: Final = FIRSTBOOT_STAGES[0]
FIRSTBOOT_STAGE_DONE: Final = FIRSTBOOT_STAGES[-1]
# Events the firstboot states fire, `<prefix><event>`; the master's reactor matches the prefix
# (reactor.yaml) and step 6 follows them, finished at FIRSTBOOT_EVENT_DONE.
FIRSTBOOT_EVENT_PREFIX: Final = "store/vm/firstboot/"
FIRSTBOOT_EVENTS: Final = ("started", "highstate", "report", "done")
FIRSTBOOT_EVENT_DONE: Final = "done"
# What the reactor re-announces firstboot events as (reactor/firstboot_progress.sls), one
# master-side tag for watchers; no Python reader yet.
ROLLOUT_PROGRESS_TAG: Final = "store/rollout/progress"

# -- bootstrap files (minion.d) --------------------------------------------------------------
# One-shot minion config: the image ships BOOTSTRAP_CONF (startup_states: FIRSTBOOT_SLS), its
# store-identity service writes IDENTITY_CONF (the autosign token grain); firstboot's last stage
# removes both (salt_states/_modules/provisioning.py BOOTSTRAP_FILES), the image's config.sh
# removes a stray IDENTITY_CONF at build time, the lab's checks assert both are gone.
MINION_CONF_DIR: Final = "minion.d"
BOOTSTRAP_CONF: Final = "90-bootstrap.conf"
IDENTITY_CONF: Final = "15-identity.conf"
BOOTSTRAP_FILES: Final = (BOOTSTRAP_CONF, IDENTITY_CONF)

# -- VM identity seed ------------------------------------------------------------------------
# The read-only ISO 9660 disk the hypervisor attaches to a VM (salt_states/_utils/store_seed_iso.py
# writes it), found by the guest's store-identity script with `blkid -t LABEL=<SEED_LABEL>`,
# holding SEED_FILE with KEY=value lines for SEED_KEYS; the lab's simulator reads the same ISO.
SEED_LABEL: Final = "STORE_SEED"
SEED_FILE: Final = "identity.env"
SEED_KEYS: Final = ("minion_id", "store_id", "autosign_token")
# the namespace of the <seed minion_id store_id state/> element storevirt keeps in the domain's
# <metadata> (never the token): whose identity a domain was seeded with
SEED_METADATA_NS: Final = "https://github.com/store-rollout/seed"
# store-identity reads a seed already at hand and writes elsewhere than /etc/salt when these are
# set (the lab's simulator and the tests run the image's own script this way).
IDENTITY_SEED_DIR_ENV: Final = "STORE_IDENTITY_SEED_DIR"
IDENTITY_SALT_DIR_ENV: Final = "STORE_IDENTITY_SALT_DIR"

# -- store VM network ------------------------------------------------------------------------
# The guest's name for the VM's one NIC (tasks/virt.interfaces_for gives it one): both images
# pass net.ifnames=0 on the kernel command line and configure DHCP on this name (leap16-jeos:
# a NetworkManager keyfile for <VM_NIC> in config.sh; lab/image_builds/lab-debian: a systemd-networkd file);
# tests/unit/tasks/test_kiwi_images.py reads both descriptions and checks both against it.
VM_NIC: Final = "eth0"

# -- rollout steps ---------------------------------------------------------------------------
# One store's steps in order: the flow runs them under these names (its task runs are named
# `<step>-<store>`, what the UI and the lab checks list), the CLI's live view and reports show
# them, result["step_seconds"] is keyed by them.
STEP_IMAGE: Final = "image"
STEP_PXE_INSTALL_HYPERVISOR: Final = "pxe_install_hypervisor"
STEP_WAIT_FOR_HYPERVISOR: Final = "wait_for_hypervisor"
STEP_PREPARE_VM_KEYS: Final = "prepare_vm_keys"
STEP_CREATE_VM: Final = "create_vm"
STEP_FIRSTBOOT: Final = "firstboot"
STEP_GO_LIVE: Final = "go_live"
STEP_NOTIFY_ERP: Final = "notify_erp"
STEPS: Final = (STEP_IMAGE, STEP_PXE_INSTALL_HYPERVISOR, STEP_WAIT_FOR_HYPERVISOR,
                STEP_PREPARE_VM_KEYS, STEP_CREATE_VM, STEP_FIRSTBOOT, STEP_GO_LIVE,
                STEP_NOTIFY_ERP)

# -- go-live gate ------------------------------------------------------------------------------
# The store server's config file, relative to its root: the store_vm formula writes it
# (salt_states/store_vm/parameters/defaults.yaml `config_dir`/`config_file`) with the role's
# services and go-live checks; firstboot's verify stage requires it; the gate (tasks/go_live.py)
# hands it to `storegate.run` on the VM's minion.
STORE_SERVER_CONFIG: Final = "etc/store-server/store.yaml"
GO_LIVE_FUNCTION: Final = "storegate.run"

# -- ERP notices -----------------------------------------------------------------------------
# The `status` of each notice the pipeline posts to the ERP (tasks/erp.py; the lab's receiver
# keeps it): the store server runs (step 7), the store is closed (decommission), the store's
# host is another box (replacement, after its step 7). A store whose
# newest notice is ERP_STORE_DECOMMISSIONED is reconciled as decommissioned.
ERP_STORE_SERVER_RUNNING: Final = "store-server-running"
ERP_STORE_DECOMMISSIONED: Final = "store-decommissioned"
ERP_STORE_HARDWARE_REPLACED: Final = "store-hardware-replaced"
ERP_STORE_IMAGE_UPDATED: Final = "store-image-updated"
ERP_STORE_HARDWARE_REFRESHED: Final = "store-hardware-refreshed"  # issue 48: moved, data kept

# -- image versions and the data disk (issue 47) -----------------------------------------------
# An image version is data (store_rollout/image_versions.py): its name goes into the build as
# IMAGE_VERSION_PARAM (so it is part of the image key), and the image's overlay bakes it into the
# VM's grain IMAGE_VERSION_GRAIN (etc/salt/minion.d/10-grains.conf): the VM says what it runs.
IMAGE_VERSION_PARAM: Final = "IMAGE_VERSION"
IMAGE_VERSION_GRAIN: Final = "store_image_version"
UNVERSIONED_IMAGE: Final = "unversioned"  # IMAGE_VERSION of an image built without a version
IMAGE_VERSION_RE: Final = r"[a-z0-9][a-z0-9._-]{0,31}"
# The store's data disk: beside the system disk (the overlay on the image), made once by step 5
# (storevirt.create_data_disk: raw, ext4 labelled DATA_DISK_LABEL by the host), mounted by the
# image at DATA_DISK_MOUNT before salt-minion starts. Nothing but decommission removes it. The
# VM's identity (minion id, store id, minion keys) lives on it under DATA_DISK_IDENTITY_DIR, so a
# new system disk (an image update) boots as the same minion with the same key.
DATA_DISK_FILE: Final = "data.raw"
DATA_DISK_LABEL: Final = "STORE_DATA"
DATA_DISK_MOUNT: Final = "/srv/store"
DATA_DISK_IDENTITY_DIR: Final = ".identity"  # under DATA_DISK_MOUNT, root only
IDENTITY_DATA_DIR_ENV: Final = "STORE_IDENTITY_DATA_DIR"  # store-identity's data disk mount
# The hypervisor's record of a system-disk switch (storevirt), written before the switch: a
# crashed orchestrator's rerun, and reconcile, read it there, not from anyone's memory.
UPDATE_RECORD_FILE: Final = "update.json"

# -- hardware refresh and backups (issue 48) ----------------------------------------------------
# Hypervisors reach each other over libvirt's TLS transport only, with certificates the master's
# libvirt CA signs (tasks/libvirt_tls.py): CN = the box's hypervisor minion id, O = LIBVIRT_TLS_ORG,
# subjectAltName = the box's address. A box's libvirtd lets in only the DNs of its own store's
# boxes (each of LIBVIRT_TLS_ALLOWED_DNS % store id: its first box, and a refreshed one with
# exactly 6 characters after -hv-), so no other store's box can push or pull a VM; never a
# `store-<id>-hv*`, which would let store 12's boxes in store 123's.
LIBVIRT_TLS_PORT: Final = 16514
LIBVIRT_TLS_ORG: Final = "store-rollout"
LIBVIRT_TLS_ALLOWED_DNS: Final = ("O=store-rollout,CN=store-%s-hv",
                                  "O=store-rollout,CN=store-%s-hv-??????")
# A refreshed box's hypervisor minion id: the store's, then the last 6 hex digits of its MAC
# (store-0042-hv-a1b2c3), so the new box signs in beside the old one with a key of its own.
REFRESHED_HV_ID_RE: Final = r"store-[A-Za-z0-9_-]+-hv(-[0-9a-f]{6})?"
# The hypervisor's record of a move of the store VM to another box (storevirt), written on the
# old box before anything moves: a crashed run's rerun reads where the VM is from it.
MOVE_RECORD_FILE: Final = "move.json"
# What a store VM's backup leaves out of DATA_DISK_MOUNT: its identity (the minion's private
# key never leaves the store).
BACKUP_EXCLUDES: Final = (DATA_DISK_IDENTITY_DIR,)

# -- the minion's link to its master (issue 49) --------------------------------------------------
# Every store minion's settings for a WAN that drops (DSL, LTE, satellite: 30-600 ms, some loss,
# cuts of minutes), so it comes back by itself after a link cut or a master restart, with nobody
# restarting it. One source: the image's minion.d/MINION_LINK_CONF
# (image_builds/overlays/salt-minion), the hypervisors' install profiles (AutoYaST, Agama) and the
# hypervisor formula's link concern write exactly these (tests/unit/store_rollout/
# test_minion_link_settings.py; each key is a minion option of Salt 3006.0 and 3008).
MINION_LINK_CONF: Final = "40-link.conf"
MINION_LINK_SETTINGS: Final = {
    # TCP keepalive on the minion's connections to the master, probing after 60 s of quiet (under
    # the 5-minute idle timeout of many NATs and LTE carrier-grade NATs, which otherwise drop the
    # mapping silently), 4 probes 15 s apart: a connection a cut killed is given up after about
    # 2 minutes (Linux's default: 2 h 11 min), and ZeroMQ connects anew
    "tcp_keepalive": True,
    "tcp_keepalive_idle": 60,
    "tcp_keepalive_cnt": 4,
    "tcp_keepalive_intvl": 15,
    # minutes: the minion sends the master a ping event every 2 minutes, which keeps its return
    # path (and the NAT's mapping of it) in use (auth_safemode stays off: no self-restart)
    "ping_interval": 2,
    # seconds: the minion checks every 30 s that its publish connection stands (status.master)
    # and logs when it was lost and when it is back (ZeroMQ itself connects again)
    "master_alive_interval": 30,
    # a minion that starts while the link is down keeps trying its master, never gives up
    "master_tries": -1,
    # authentication over a 600-ms, lossy satellite link: 30 s per try (the default 5 s is one
    # lost packet and a retransmission), 10 tries
    "auth_tries": 10,
    "auth_timeout": 30,
    # seconds: after a master restart or key rotation every store re-authenticates at a random
    # moment within 60 s, not all at once (a region of 1,000 stores, 2,000 minions)
    "random_reauth_delay": 60,
    # ZeroMQ's reconnect: 1 s first, backing off to 30 s at most, randomized: a cut region's
    # minions do not all knock at the same second when the master is back
    "recon_default": 1000,
    "recon_max": 30000,
    "recon_randomize": True,
    # seconds between the minion's tries to have its key accepted, backing off to a minute
    "acceptance_wait_time": 10,
    "acceptance_wait_time_max": 60,
}
