"""The overlay's store-identity script (image_builds/overlays/salt-minion, checked by
tasks/kiwi/overlay.py) against the hypervisor's seed disk (salt_states/_utils/store_seed_iso.py,
which storevirt.seed_identity writes with)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from salt.exceptions import CommandExecutionError

from store_rollout.contracts import (
    BOOTSTRAP_CONF,
    DATA_DISK_IDENTITY_DIR,
    IDENTITY_DATA_DIR_ENV,
    IDENTITY_SALT_DIR_ENV,
    IDENTITY_SEED_DIR_ENV,
)
from tasks.kiwi import IDENTITY_SCRIPT
from tests.helpers import load_salt_module
from tests.kiwi_helpers import OVERLAY


def _seed_iso() -> ModuleType:
    return load_salt_module("_utils", "store_seed_iso")


def _seed_content(iso: Path, dest: Path) -> Path:
    """The seed as the guest sees it once mounted (xorriso extracts instead of a loop mount)."""
    subprocess.run(["xorriso", "-osirrox", "on", "-indev", str(iso), "-extract", "/", str(dest)],
                   check=True, capture_output=True)  # fmt: skip
    return dest


def test_store_identity_script_reads_the_seed_disk(tmp_path: Path) -> None:
    """The hypervisor's seed ISO (store_seed_iso.write_seed) and the image's store-identity agree:
    label, file name, keys, values; the guest never executes the seed."""
    seed_iso = _seed_iso()
    script = (OVERLAY / IDENTITY_SCRIPT).read_text()
    assert f"SEED_LABEL={seed_iso.SEED_LABEL}\n" in script
    assert f"SEED_FILE={seed_iso.SEED_FILE}\n" in script
    for key in seed_iso.SEED_KEYS:
        assert f"{key})" in script, key
    iso = Path(seed_iso.write_seed(str(tmp_path / "vm" / "seed.iso"), {
        "minion_id": "store-042-srv1", "store_id": "0042", "autosign_token": "tok-3f2c1c8e"}))
    assert iso.stat().st_mode & 0o777 == 0o600 and iso.stat().st_size < 1024 * 1024
    label = subprocess.run(["blkid", "-p", "-s", "LABEL", "-o", "value", str(iso)],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert label == "STORE_SEED"  # what the guest's blkid -t LABEL=... finds
    seed = _seed_content(iso, tmp_path / "seed")
    assert sorted(p.name for p in seed.iterdir()) == ["identity.env"]
    salt = tmp_path / "salt"
    env = {"PATH": os.environ["PATH"], "STORE_IDENTITY_SALT_DIR": str(salt),
           "STORE_IDENTITY_SEED_DIR": str(seed)}
    subprocess.run([str(OVERLAY / IDENTITY_SCRIPT)], check=True, env=env, capture_output=True)
    assert (salt / "minion_id").read_text() == "store-042-srv1\n"
    ident = salt / "minion.d/15-identity.conf"
    assert yaml.safe_load(ident.read_text()) == {
        "grains": {"store_rollout_token": "tok-3f2c1c8e", "store_id": "0042"}}
    assert ident.stat().st_mode & 0o777 == 0o640
    # a seed is data: a value that would be code is refused by the guest
    (seed / "identity.env").write_text("minion_id=store-1\nautosign_token=$(reboot)\n")
    proc = subprocess.run([str(OVERLAY / IDENTITY_SCRIPT)], env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 1 and "refusing invalid value" in proc.stderr
    # no seed (ejected after firstboot): the identity written before stays
    (seed / "identity.env").unlink()
    proc = subprocess.run([str(OVERLAY / IDENTITY_SCRIPT)], env=env, capture_output=True,
                          text=True, check=True)
    assert "leaving identity unchanged" in proc.stdout
    assert (salt / "minion_id").read_text() == "store-042-srv1\n"


def test_every_autosign_token_passes_the_seed_and_the_guest() -> None:
    """Tokens come from one generator; the hypervisor's seed and the guest's script both take
    them (the lab found a urlsafe token starting with '-' refused by the guest)."""
    from tasks.salt.tokens import new_autosign_token

    seed_iso = _seed_iso()
    guest = re.search(r"^VALID='(.+)'$", (OVERLAY / IDENTITY_SCRIPT).read_text(), re.M)
    assert guest is not None
    for _ in range(2000):
        token = new_autosign_token()
        assert seed_iso._seed_text({"minion_id": "m", "autosign_token": token})
        assert re.fullmatch(guest[1], token), token


@pytest.mark.parametrize(("identity", "message"), [
    ({"store_id": "1"}, "minion_id is required"),
    ({"minion_id": "a b"}, "minion_id is a value the guest refuses"),
    ({"minion_id": "m", "autosign_token": "x'/>"}, "autosign_token is a value the guest"),
    ({"minion_id": "m", "autosign_token": "-starts-with-a-dash"}, "must start with a letter"),
    ({"minion_id": "m", "role": "x"}, "unknown keys ['role']"),
])
def test_seed_refuses_what_the_guest_would(identity: dict[str, str], message: str,
                                           tmp_path: Path) -> None:
    seed_iso = _seed_iso()
    with pytest.raises(CommandExecutionError, match=re.escape(message)):
        seed_iso.write_seed(str(tmp_path / "seed.iso"), identity)
    assert not list(tmp_path.iterdir())  # nothing half-written


def _identity(seed: Path | None, salt: Path, data: Path) -> subprocess.CompletedProcess[str]:
    """The image's store-identity with the seed's and the data disk's content at hand (as the
    lab's simulator runs it); no seed dir: an empty one (the seed disk was ejected)."""
    empty = salt.parent / "no-seed"
    empty.mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], IDENTITY_SALT_DIR_ENV: str(salt),
           IDENTITY_SEED_DIR_ENV: str(seed or empty), IDENTITY_DATA_DIR_ENV: str(data)}
    return subprocess.run([str(OVERLAY / IDENTITY_SCRIPT)], env=env, capture_output=True,
                          text=True, check=False)


def _image_salt_dir(path: Path) -> Path:
    """/etc/salt as the image ships it: minion.d with the bootstrap file."""
    (path / "minion.d").mkdir(parents=True)
    for name in ("10-grains.conf", BOOTSTRAP_CONF):
        (path / "minion.d" / name).write_text("# shipped\n")
    return path


def test_store_identity_keeps_a_seeded_identity_on_the_data_disk(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "identity.env").write_text(
        "minion_id=store-0042-vm\nstore_id=0042\nautosign_token=tok-3f2c1c8e\n")
    data = tmp_path / "data"
    data.mkdir()
    kept = data / DATA_DISK_IDENTITY_DIR
    salt = _image_salt_dir(tmp_path / "salt")
    proc = _identity(seed, salt, data)
    assert proc.returncode == 0, proc.stderr
    assert (kept / "minion_id").read_text() == "store-0042-vm\n"
    assert (kept / "store_id").read_text() == "0042\n"
    assert kept.stat().st_mode & 0o777 == 0o700
    assert "tok-3f2c1c8e" not in "".join(p.read_text() for p in kept.iterdir() if p.is_file())
    assert (salt / "minion.d" / BOOTSTRAP_CONF).exists()  # a first boot runs firstboot
    # a reboot during firstboot (seed still attached) keeps the minion's keys; a seed naming
    # another minion (a new machine on an old data disk) drops them
    (kept / "pki" / "minion").mkdir(parents=True)
    (kept / "pki" / "minion" / "minion.pem").write_text("key")
    assert _identity(seed, salt, data).returncode == 0
    assert (kept / "pki" / "minion" / "minion.pem").exists()
    (seed / "identity.env").write_text("minion_id=store-0043-vm\nstore_id=0043\n")
    assert _identity(seed, salt, data).returncode == 0
    assert not (kept / "pki").exists() and (kept / "minion_id").read_text() == "store-0043-vm\n"


def test_store_identity_restores_the_data_disks_identity_without_a_seed(tmp_path: Path) -> None:
    """An updated system disk (no seed, a fresh /etc/salt from the new image) boots as the
    minion the data disk keeps, without firstboot."""
    data = tmp_path / "data"
    (data / DATA_DISK_IDENTITY_DIR).mkdir(parents=True)
    (data / DATA_DISK_IDENTITY_DIR / "minion_id").write_text("store-0042-vm\n")
    salt = _image_salt_dir(tmp_path / "salt")
    proc = _identity(None, salt, data)
    assert proc.returncode == 0, proc.stderr
    assert "restored from the data disk" in proc.stdout
    assert (salt / "minion_id").read_text() == "store-0042-vm\n"
    assert not (salt / "minion.d" / BOOTSTRAP_CONF).exists()
    assert (salt / "minion.d" / "10-grains.conf").exists()
    # what the data disk keeps is data too: a value that would be code is refused
    (data / DATA_DISK_IDENTITY_DIR / "minion_id").write_text("$(reboot)\n")
    proc = _identity(None, _image_salt_dir(tmp_path / "salt2"), data)
    assert proc.returncode == 1 and "refusing invalid minion_id" in proc.stderr


def test_store_identity_without_seed_or_kept_identity_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    salt = _image_salt_dir(tmp_path / "salt")
    proc = _identity(None, salt, data)
    assert proc.returncode == 0 and "leaving identity unchanged" in proc.stdout
    assert not (salt / "minion_id").exists() and (salt / "minion.d" / BOOTSTRAP_CONF).exists()
    assert list(data.iterdir()) == []
