"""A decommission's export of the store's data disk, kept where it survives the box's retirement
(store_rollout/data_disk.py says what each action does to the data disk):

1. the store server shut down cleanly (storevirt.shutdown): its data disk at rest;
2. the host packs it (storedata.export_data_disk: a gzip'd sparse tar of data.raw, its sha256);
3. the host pushes the archive to its master (Salt's cp.push, into the master's cache: the master
   needs `file_recv: True` and a `file_recv_max_size` above the archive, docs/production.md);
4. this worker, on the master's host, moves it out of the master's cache (Salt 3006 clears a
   deleted key's cache, and the decommission deletes the host's key next) into
   `data_export_dir`/<store>/, checking the host's sha256 on the way, and writes
   `<file>.sha256` (`sha256sum -c` checks it) and `<file>.json` beside it.

A rerun whose host is gone (powered off by the earlier run) finds the export that run kept.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from store_rollout import data_disk
from store_rollout.contracts import DATA_DISK_FILE
from store_rollout.inventory import Store
from store_rollout.settings_parts import SaltSettings
from tasks.retry import SALT_VIRT_RETRY
from tasks.salt import SaltMasterClient, SaltTransientError, master_client

SHUTDOWN_SECONDS = 120  # storevirt.shutdown's wait for a clean stop before a hard one
EXPORT_TIMEOUT = 3600  # seconds the host may take to pack the data disk
PUSH_TIMEOUT = 6 * 3600  # seconds its push to the master may take (cp.push's chunks)
CHUNK = 1 << 20


class DataExportError(Exception):
    """The data disk's export could not be made or kept: the decommission changed nothing."""


@dataclass(frozen=True)
class DataExport:
    """An export kept on this host: the archive, its sha256 and what it holds."""

    path: str
    sha256: str
    bytes: int
    data_disk: str
    host: str
    made_at: str

    def result(self, earlier: bool = False) -> dict[str, Any]:
        return {"kept": True, **asdict(self), "checksum_file": self.path + ".sha256",
                "from_earlier_run": earlier}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def push_limit(opts: dict[str, Any]) -> int:
    """The largest file the master takes from a minion (bytes); DataExportError, naming the
    fix, when it takes none."""
    if not opts.get("file_recv"):
        raise DataExportError("the Salt master does not take files from minions (file_recv is "
                              "off): set `file_recv: True` and `file_recv_max_size` (MB) in its "
                              "config (docs/production.md) and restart it, or decommission "
                              "with --no-export")
    return int(opts.get("file_recv_max_size") or 100) * 1024 * 1024


def receive(pushed: Path, export_dir: Path, store: Store, made: dict[str, Any],
            name: str) -> DataExport:
    """Move the archive the host pushed (`pushed`, in the master's cache) to
    `export_dir`/<store>/`name`, its sha256 checked against the host's (`made`), with its
    .sha256 and .json beside it; private to this host's user (the store's data)."""
    where = export_dir / store.store_id
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    final, part = where / name, where / (name + ".part")
    digest = hashlib.sha256()
    with pushed.open("rb") as src, os.fdopen(
            os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as dst:
        for block in iter(lambda: src.read(CHUNK), b""):
            digest.update(block)
            dst.write(block)
        dst.flush()
        os.fsync(dst.fileno())
    if digest.hexdigest() != made["sha256"]:
        part.unlink()
        raise DataExportError(f"store {store.store_id}: the export the master received, {pushed}, "
                              f"has sha256 {digest.hexdigest()}, the host made "
                              f"{made['sha256']}: not kept; rerun the decommission")
    os.replace(part, final)
    export = DataExport(path=str(final), sha256=made["sha256"], bytes=final.stat().st_size,
                        data_disk=made["data_disk"], host=store.hypervisor_minion_id,
                        made_at=datetime.now(UTC).isoformat(timespec="seconds"))
    Path(export.path + ".sha256").write_text(f"{export.sha256}  {name}\n")
    Path(export.path + ".json").write_text(json.dumps(
        {**asdict(export), "store_id": store.store_id, "vm": store.vm_name,
         "data_disk_bytes": made.get("data_disk_bytes"),
         "restore": f"tar -xSzf {name} gives back {DATA_DISK_FILE}, sparse"},
        indent=2))
    pushed.unlink()
    return export


def verified(path: Path) -> bool:
    """The export at `path` matches the sha256 its .sha256 file names."""
    sums = Path(str(path) + ".sha256")
    if not path.is_file() or not sums.is_file():
        return False
    return sums.read_text().split()[0] == sha256_of(path)


def latest_export(export_dir: Path, store: Store) -> DataExport | None:
    """The newest verified export of the store's data disk kept in `export_dir`, else None."""
    where = export_dir / store.store_id
    names = sorted((p.name for p in where.glob(f"*{data_disk.EXPORT_SUFFIX}")
                    if data_disk.is_export_name(store, p.name)), reverse=True) \
        if where.is_dir() else []
    for name in names:
        path = where / name
        if verified(path):
            meta = json.loads(Path(str(path) + ".json").read_text())
            return DataExport(**{k: meta[k] for k in DataExport.__dataclass_fields__})
    return None


def _host_answers(master: SaltMasterClient, hv: str) -> bool:
    return master.key_state(hv) == "accepted" and master.ping(hv)


def _made_on_host(master: SaltMasterClient, store: Store, limit: int) -> dict[str, Any]:
    """The host's archive of the data disk (the VM shut down first), or exported False."""
    hv, vm = store.hypervisor_minion_id, store.vm_name
    summary = master.cmd(hv, "storevirt.domain_summary", [vm])
    if summary and summary.get("active"):
        master.cmd(hv, "storevirt.shutdown", [vm], kwarg={"timeout": SHUTDOWN_SECONDS},
                   timeout=SHUTDOWN_SECONDS + 60)
    made: dict[str, Any] = master.cmd(hv, "storedata.export_data_disk", [vm],
                                      kwarg={"max_bytes": limit}, timeout=EXPORT_TIMEOUT)
    return made


def _pushed(master: SaltMasterClient, store: Store, made: dict[str, Any], name: str) -> Path:
    """The archive pushed to the master: where it landed in the master's cache."""
    hv = store.hypervisor_minion_id
    upload = f"{data_disk.PUSH_DIR}/{name}"
    done = master.cmd(hv, "cp.push", [made["path"]],
                      kwarg={"upload_path": upload, "remove_source": True}, timeout=PUSH_TIMEOUT)
    landed = Path(master.opts["cachedir"]) / "minions" / hv / "files" / upload
    if done is not True or not landed.is_file():
        raise DataExportError(f"store {store.store_id}: {hv} could not push the export of its "
                              f"data disk to the master (cp.push answered {done!r}): check the "
                              "master's file_recv and file_recv_max_size (docs/production.md), "
                              "or decommission with --no-export")
    return landed


@task(name="export_data_disk", task_run_name="export-data-disk-{store.store_id}",
      **SALT_VIRT_RETRY.on(SaltTransientError))
def export_data_disk(store: Store, salt: SaltSettings, keep_export: bool = True) -> dict[str, Any]:
    """A decommission's first change: the store's data disk exported and kept in
    `data_export_dir` (the module's docstring says how); {"kept": False} when told not to
    (`keep_export` false) or when the host has no data disk. A host that does not answer (an
    earlier run powered it off) is not asked: the newest export an earlier run kept stands,
    and without one the run fails here, having changed nothing."""
    logger = get_run_logger()
    if not keep_export:
        logger.warning("store %s: no export of its data disk, as asked (--no-export)",
                       store.store_id)
        return {"kept": False, "asked": False}
    master = master_client(salt.salt_master_config)
    export_dir, hv = Path(salt.data_export_dir), store.hypervisor_minion_id
    if not _host_answers(master, hv):
        earlier = latest_export(export_dir, store)
        if earlier is None:
            raise DataExportError(
                f"store {store.store_id}: {hv} has no accepted key or does not answer, and no "
                f"export of its data disk is kept in {export_dir / store.store_id}: bring the "
                "host back, or decommission with --no-export (its data disk is then lost)")
        logger.info("store %s: %s does not answer; the export an earlier run kept stands: %s "
                    "(sha256 %s)", store.store_id, hv, earlier.path, earlier.sha256)
        return earlier.result(earlier=True)
    made = _made_on_host(master, store, push_limit(master.opts))
    if not made.get("exported"):
        logger.info("store %s: %s has no data disk of %s: nothing to export", store.store_id,
                    hv, store.vm_name)
        return {"kept": False, "asked": True, "data_disk": None}
    name = data_disk.export_name(store, datetime.now(UTC))
    export = receive(_pushed(master, store, made, name), export_dir, store, made, name)
    create_markdown_artifact(
        key=f"data-export-{store.store_id.lower()}",
        markdown=f"Export of store {store.store_id}'s data disk {export.data_disk} "
                 f"({hv}): `{export.path}`, {export.bytes} bytes, sha256 `{export.sha256}` "
                 f"(`sha256sum -c {Path(export.path).name}.sha256` in its directory)",
        description=f"store {store.store_id}: its data disk's export")
    logger.warning("store %s: data disk %s exported to %s (%d bytes, sha256 %s)",
                   store.store_id, export.data_disk, export.path, export.bytes, export.sha256)
    return export.result()
