"""A store VM's backups of its data disk (issue 48), on the VM: restic to the region's REST
server (https, the server's CA from the pillar), the VM's own repository `<url>/<minion id>/`,
append-only for the VM (it cannot delete its backups; the orchestrator's retention does).

The credentials come from the VM's pillar `store_backup` only (the master's ext_pillar derives
them by the authenticated minion id), compiled afresh for each call; they reach restic by its
environment, never its command line, and no return value, error or log line holds them.

What is backed up: the data disk's mount (store_rollout/contracts.py DATA_DISK_MOUNT), relative
to it (a snapshot restores into any mount), without BACKUP_EXCLUDES (the VM's identity: its
minion key never leaves the store). Runs under the store hosts' Python 3.6 (vermin). A minion
with a private root_dir (a simulated machine) backs up the directory under that root.
"""

import json
import os
import re
import subprocess
import tempfile
import time

from salt.exceptions import CommandExecutionError

__virtualname__ = "storebackup"

DATA_DISK_MOUNT = "/srv/store"  # store_rollout/contracts.py DATA_DISK_MOUNT
BACKUP_EXCLUDES = (".identity",)  # store_rollout/contracts.py BACKUP_EXCLUDES
TAG = "store-rollout"
SNAPSHOT_ID = re.compile(r"[0-9a-f]{8,64}\Z")
BACKUP_TIMEOUT = 6 * 3600  # seconds one backup may take
CALL_TIMEOUT = 600  # seconds a listing or an init may take


def __virtual__():
    return __virtualname__


def _mount():
    return os.path.join(__opts__.get("root_dir", "/"), DATA_DISK_MOUNT.lstrip("/"))


def _fresh_pillar():
    """The minion's pillar as the master compiles it now (pillar.items' way, without the
    output masking newer Salt applies to its return: the values are used here, not shown)."""
    import salt.pillar  # pylint: disable=import-outside-toplevel

    return salt.pillar.get_pillar(
        __opts__, __grains__, __opts__["id"], saltenv=__opts__.get("saltenv"),
        pillarenv=__opts__.get("pillarenv")).compile_pillar()


def _settings():
    """The VM's `store_backup` pillar, compiled by the master now (a rotated key applies at
    once); an error naming what is missing otherwise."""
    found = _fresh_pillar().get("store_backup") or {}
    missing = [name for name in ("url", "user", "rest_password", "repository_password")
               if not found.get(name)]
    if missing:
        raise CommandExecutionError(
            "no backup target for this minion: its pillar store_backup lacks {} (the master's "
            "store_backup ext_pillar is not configured, or this is not a store VM)".format(
                ", ".join(missing)))
    return found


class _Restic(object):
    """restic with the VM's repository and password in its environment only."""

    def __init__(self, settings):
        self.secrets = (settings["rest_password"], settings["repository_password"])
        url = settings["url"].rstrip("/")
        scheme, _, rest = url.partition("://")
        if scheme != "https" or not rest:
            raise CommandExecutionError(
                "pillar store_backup:url {!r}: expected https://host:port".format(url))
        self.repository = "rest:https://{}:{}@{}/{}/".format(
            settings["user"], settings["rest_password"], rest, settings["user"])
        self.password = settings["repository_password"]
        self.host = settings["user"]
        work = os.path.join(__opts__.get("cachedir", tempfile.gettempdir()), "storebackup")
        if not os.path.isdir(work):
            os.makedirs(work, 0o700)
        self.cache = os.path.join(work, "restic-cache")
        self.ca_file = None
        if settings.get("ca_pem"):
            self.ca_file = os.path.join(work, "backup-ca.pem")
            with open(self.ca_file, "w") as handle:
                handle.write(settings["ca_pem"])

    def scrub(self, text):
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def run(self, args, timeout=CALL_TIMEOUT, cwd=None, check=True):
        argv = ["restic", "--cache-dir", self.cache]
        if self.ca_file:
            argv += ["--cacert", self.ca_file]
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
               "HOME": os.path.dirname(self.cache),
               "RESTIC_REPOSITORY": self.repository, "RESTIC_PASSWORD": self.password}
        try:
            proc = subprocess.run(argv + list(args), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env, cwd=cwd, timeout=timeout,
                                  universal_newlines=True, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CommandExecutionError("restic {}: {}".format(args[0], self.scrub(str(exc))))
        if check and proc.returncode != 0:
            raise CommandExecutionError("restic {} failed ({}): {}".format(
                args[0], proc.returncode, self.scrub(proc.stderr.strip())[-800:]))
        return proc

    def ensure_repository(self):
        """The VM's repository, made on its first backup; True when made now."""
        if self.run(["cat", "config"], check=False).returncode == 0:
            return False
        self.run(["init"])
        return True

    def snapshots(self):
        listed = json.loads(self.run(["snapshots", "--json"]).stdout or "[]") or []
        return sorted(({key: snap.get(key) for key in
                        ("id", "short_id", "time", "hostname", "paths", "tags")}
                       for snap in listed), key=lambda snap: snap["time"])


def run():
    """Back up the data disk now: a new snapshot in the VM's repository (made on the first
    backup). Returns {"snapshot", "short_id", "time", "files", "bytes", "added_bytes",
    "initialized", "seconds"}.

    CLI Example: salt 'store-0001-vm' storebackup.run
    """
    started = time.monotonic()
    mount = _mount()
    if not os.path.isdir(mount):
        raise CommandExecutionError("{} is missing: no data disk to back up".format(mount))
    if os.path.realpath(__opts__.get("root_dir", "/")) == "/" and not os.path.ismount(mount):
        raise CommandExecutionError("{} is not mounted: the data disk is not there, nothing "
                                    "is backed up (storedata.mount_status)".format(mount))
    if not set(os.listdir(mount)) - set(BACKUP_EXCLUDES):
        raise CommandExecutionError("{} holds nothing but the VM's identity: nothing to back "
                                    "up yet".format(DATA_DISK_MOUNT))
    restic = _Restic(_settings())
    initialized = restic.ensure_repository()
    args = ["backup", ".", "--json", "--host", restic.host, "--tag", TAG]
    for name in BACKUP_EXCLUDES:
        args += ["--exclude", os.path.join(mount, name)]
    proc = restic.run(args, timeout=BACKUP_TIMEOUT, cwd=mount)
    summary = {}
    for line in proc.stdout.splitlines():
        if '"summary"' in line:
            summary = json.loads(line)
    short = summary.get("snapshot_id", "")
    made = [snap for snap in restic.snapshots() if short and snap["id"].startswith(short)]
    if not made:
        raise CommandExecutionError("restic backup ended without a snapshot: {}".format(
            restic.scrub(proc.stderr.strip())[-800:]))
    return {"snapshot": made[-1]["id"], "short_id": made[-1]["short_id"],
            "time": made[-1]["time"], "files": summary.get("total_files_processed"),
            "bytes": summary.get("total_bytes_processed"),
            "added_bytes": summary.get("data_added"), "initialized": initialized,
            "seconds": round(time.monotonic() - started, 3)}


def snapshots():
    """The VM's snapshots, oldest first ([] before its first backup): each {"id", "short_id",
    "time", "hostname", "paths", "tags"}.

    CLI Example: salt 'store-0001-vm' storebackup.snapshots
    """
    restic = _Restic(_settings())
    if restic.run(["cat", "config"], check=False).returncode != 0:
        return []
    return restic.snapshots()


def _record_file():
    work = os.path.join(__opts__.get("cachedir", tempfile.gettempdir()), "storebackup")
    return os.path.join(work, "restored.json")


def restored():
    """The restore this VM already had ({"snapshot", "at"}), or None. Kept on the system disk
    (the minion's cachedir): a rerun of a replacement never restores over a live store's newer
    data.

    CLI Example: salt 'store-0001-vm' storebackup.restored
    """
    try:
        with open(_record_file()) as handle:
            return json.load(handle)
    except (IOError, OSError, ValueError):
        return None


def restore(snapshot_id):
    """Restore snapshot `snapshot_id` (its id or short id) into the data disk's mount, once per
    VM: its files written over the ones there, the VM's identity untouched (never in a
    snapshot, and excluded here too). A VM that had a restore already returns that one,
    restoring nothing. Returns {"snapshot", "target", "seconds", "already"}.

    CLI Example: salt 'store-0001-vm' storebackup.restore 1a2b3c4d
    """
    snapshot_id = str(snapshot_id)
    if not SNAPSHOT_ID.match(snapshot_id):
        raise CommandExecutionError("snapshot {!r}: expected a restic snapshot id (hex)".format(
            snapshot_id))
    earlier = restored()
    if earlier:
        return {"snapshot": earlier["snapshot"], "target": DATA_DISK_MOUNT, "seconds": 0,
                "already": True}
    started = time.monotonic()
    mount = _mount()
    if not os.path.isdir(mount):
        raise CommandExecutionError("{} is missing: no data disk to restore into".format(mount))
    restic = _Restic(_settings())
    args = ["restore", snapshot_id, "--target", mount]
    for name in BACKUP_EXCLUDES:
        args += ["--exclude", "/" + name]
    restic.run(args, timeout=BACKUP_TIMEOUT)
    record = _record_file()
    with open(record + ".part", "w") as handle:
        json.dump({"snapshot": snapshot_id, "at": time.time()}, handle)
    os.rename(record + ".part", record)
    return {"snapshot": snapshot_id, "target": DATA_DISK_MOUNT,
            "seconds": round(time.monotonic() - started, 3), "already": False}
