"""A store's backups end to end without the lab: a real `rclone serve restic` (Debian's rclone,
as the lab's backup target runs it: TLS from a CA made here, bcrypt htpasswd, the stores'
endpoint private and append-only, an admin endpoint beside it), the store side the VM's
storebackup module with the pillar the master's ext_pillar renders for it, and the
orchestrator's admin client (tasks/backup.py) listing, checking and pruning."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from pydantic import SecretStr

from lab.backup_server import ADMIN_USER, BackupFiles, issue_certificate, rclone_argv, write_htpasswd
from lab.ports import choose
from lab.prefect_access import ensure_tls
from store_rollout.backup_secrets import REST_PASSWORD, derive
from tasks.backup import BackupError, BackupUnavailable, ResticAdmin, age_hours
from tests.helpers import load_salt_module

pytestmark = pytest.mark.skipif(not (shutil.which("rclone") and shutil.which("restic")),
                                reason="rclone and restic (make setup) are needed")

VM, OTHER = "store-0901-vm", "store-0902-vm"


@dataclass
class Target:
    url: str  # the stores' endpoint
    admin: ResticAdmin
    ca_file: Path
    key_file: Path
    root: Path


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Target]:
    tls = ensure_tls(tmp_path / "ca")
    files = BackupFiles.of(tmp_path)
    key, admin_password = files.ensure_secrets()
    files.data.mkdir()
    issue_certificate(tls, files.cert, files.cert_key, addresses=("127.0.0.1",))
    write_htpasswd(files.htpasswd, {vm: derive(key, vm, REST_PASSWORD) for vm in (VM, OTHER)})
    write_htpasswd(files.htpasswd_admin, {ADMIN_USER: admin_password})
    ports = choose(["stores", "admin"], tmp_path / ".lab-backup-test", {})
    procs = [subprocess.Popen(rclone_argv(files, ports[name], stores=name == "stores"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name in ("stores", "admin")]
    try:
        for name in ("stores", "admin"):
            deadline = time.monotonic() + 20
            while True:
                try:
                    requests.get(f"https://127.0.0.1:{ports[name]}/", verify=str(tls.ca),
                                 timeout=2)
                    break
                except requests.ConnectionError:
                    assert time.monotonic() < deadline, f"rclone {name} did not listen"
                    time.sleep(0.1)
        admin = ResticAdmin(f"https://127.0.0.1:{ports['admin']}", ADMIN_USER,
                            SecretStr(admin_password), SecretStr(key), str(tls.ca))
        yield Target(f"https://127.0.0.1:{ports['stores']}", admin, tls.ca, files.key, tmp_path)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def store_vm(target: Target, minion_id: str, root: Path) -> Any:
    """The VM's storebackup module as its minion loads it, its pillar the ext_pillar's."""
    pillar_mod = load_salt_module("_pillar", "store_backup")
    pillar = pillar_mod.ext_pillar(minion_id, {}, key_file=str(target.key_file), url=target.url,
                                   ca_file=str(target.ca_file))
    module = load_salt_module("_modules", "storebackup", {})
    module.__opts__ = {"root_dir": str(root), "cachedir": str(root / "var/cache/salt")}
    module._fresh_pillar = lambda: pillar  # the master's compile, stood in by its ext_pillar
    return module


def data_disk(root: Path) -> Path:
    mount = root / "srv" / "store"
    (mount / ".identity").mkdir(parents=True)
    (mount / ".identity" / "minion.pem").write_text(f"the key of {root.name}\n")
    (mount / "lost+found").mkdir()
    return mount


def test_a_store_backs_up_and_the_admin_side_verifies_prunes_and_a_new_vm_restores(
        target: Target) -> None:
    assert target.admin.snapshots(VM) == []  # no repository before the first backup
    mount = data_disk(target.root / "old-vm")
    (mount / "pos").mkdir()
    (mount / "pos" / "sales.db").write_text("queued sale 1\n")
    vm = store_vm(target, VM, target.root / "old-vm")
    first = vm.run()
    assert first["initialized"] is True and first["files"] == 1  # .identity left out
    (mount / "pos" / "sales.db").write_text("queued sale 1\nqueued sale 2\n")
    second = vm.run()
    assert second["initialized"] is False
    listed = target.admin.snapshots(VM)
    assert [s["id"] for s in listed] == [first["snapshot"], second["snapshot"]]
    assert listed[-1]["hostname"] == VM and 0 <= age_hours(listed[-1]) < 1
    assert [s["id"] for s in vm.snapshots()] == [first["snapshot"], second["snapshot"]]
    assert target.admin.check(VM)["ok"] is True
    # one a day kept: both are today's, the newer stays
    kept = target.admin.forget(VM, keep_daily=1, keep_weekly=0)
    assert kept == {"kept": [second["snapshot"]], "removed": [first["snapshot"]]}
    assert [s["id"] for s in target.admin.snapshots(VM)] == [second["snapshot"]]

    new_mount = data_disk(target.root / "new-vm")
    restored = store_vm(target, VM, target.root / "new-vm").restore(second["snapshot"])
    assert restored["snapshot"] == second["snapshot"]
    assert (new_mount / "pos" / "sales.db").read_text() == "queued sale 1\nqueued sale 2\n"
    assert (new_mount / ".identity" / "minion.pem").read_text() == "the key of new-vm\n"
    # once per VM: a rerun never restores over what the store wrote since
    (new_mount / "pos" / "sales.db").write_text("live again\n")
    again = store_vm(target, VM, target.root / "new-vm").restore(first["snapshot"])
    assert again["already"] is True and again["snapshot"] == second["snapshot"]
    assert (new_mount / "pos" / "sales.db").read_text() == "live again\n"


def test_a_store_cannot_delete_its_backups_nor_reach_another_stores(target: Target) -> None:
    """The stores' endpoint by the REST protocol itself (restic would retry each refusal)."""
    data_disk(target.root / "vm")
    vm = store_vm(target, VM, target.root / "vm")
    made = vm.run()["snapshot"]
    pillar = vm._fresh_pillar()["store_backup"]
    login = (VM, pillar["rest_password"])
    own = requests.delete(f"{target.url}/{VM}/snapshots/{made}", auth=login,
                          verify=str(target.ca_file), timeout=10)
    assert own.status_code == 403  # append-only
    assert requests.head(f"{target.url}/{VM}/config", auth=login, verify=str(target.ca_file),
                         timeout=10).status_code == 200
    other = requests.head(f"{target.url}/{OTHER}/config", auth=login,
                          verify=str(target.ca_file), timeout=10)
    assert other.status_code in (401, 403)  # private repos
    wrong = requests.head(f"{target.url}/{VM}/config", auth=(VM, "guessed"),
                          verify=str(target.ca_file), timeout=10)
    assert wrong.status_code == 401
    assert [s["id"] for s in target.admin.snapshots(VM)] == [made]


def test_secrets_stay_out_of_errors_and_a_wrong_key_is_refused(target: Target) -> None:
    data_disk(target.root / "vm")
    store_vm(target, VM, target.root / "vm").run()
    wrong = ResticAdmin(target.admin.url, ADMIN_USER, SecretStr("not-the-password"),
                        SecretStr("k"), str(target.ca_file))
    with pytest.raises(BackupError, match="refused the admin login"):
        wrong.snapshots(VM)
    bad_key = ResticAdmin(target.admin.url, target.admin.user, target.admin._password,
                          SecretStr("another key"), str(target.ca_file))
    with pytest.raises(BackupError) as failed:
        bad_key.snapshots(VM)
    said = str(failed.value)
    assert target.admin._password.get_secret_value() not in said
    assert derive("another key", VM, "repository-password") not in said


def test_only_a_404_says_a_store_has_no_backup(tmp_path: Path) -> None:
    # a replacement restores the newest backup; a wrong answer taken for "none" would put the
    # store in service with an empty data disk
    import http.server
    import threading

    answers = {"/has/config": 200, "/none/config": 404, "/moved/config": 302,
               "/busy/config": 429, "/down/config": 503}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # noqa: N802 - the handler's own name
            self.send_response(answers.get(self.path, 400))
            self.send_header("Location", "http://127.0.0.1:9/elsewhere")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        admin = ResticAdmin(f"http://127.0.0.1:{server.server_port}", "admin", SecretStr("pw"),
                            SecretStr("key"))
        assert admin.exists("has") is True and admin.exists("none") is False
        for minion in ("moved", "busy", "elsewhere"):
            with pytest.raises(BackupError, match=r"200 or 404 expected"):
                admin.exists(minion)
        with pytest.raises(BackupUnavailable):
            admin.exists("down")
    finally:
        server.shutdown()
        server.server_close()
