"""The autosign token file is read by the Salt master as its own user (`user:` in its config;
Leap's salt-master runs as `salt`): a token written by a root worker must be readable by it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.salt import SaltError, SaltMasterClient


@pytest.fixture
def master_dir() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("this test needs root (make test runs as root): it hands a file to 'nobody'")
    root = Path(tempfile.mkdtemp(prefix="autosign-owner-", dir="/tmp"))
    root.chmod(0o755)  # the other user must reach the file, as /etc/salt is reachable
    yield root
    shutil.rmtree(root)


def write_config(root: Path, user: str) -> Path:
    config = root / "master"
    config.write_text(f"user: {user}\nroot_dir: {root}\npki_dir: {root}/pki\n"
                      f"cachedir: {root}/cache\nsock_dir: {root}/sock\n"
                      f"autosign_grains_dir: {root}/autosign_grains\n")
    return config


def test_token_file_is_readable_by_the_masters_user(master_dir: Path) -> None:
    client = SaltMasterClient(write_config(master_dir, "nobody"))
    token = client.issue_token("store-0001-vm")
    path = client.tokens.autosign_file
    path.parent.chmod(0o755)
    assert path.stat().st_mode & 0o777 == 0o600  # nobody else
    read = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           "cat", str(path)], capture_output=True, text=True, check=False)
    assert read.returncode == 0, read.stderr
    assert read.stdout.split() == [token]
    # revoking rewrites the file: still the master's
    client.issue_token("store-0002-vm")
    client.revoke_token("store-0001-vm")
    assert path.stat().st_uid == int(subprocess.run(["id", "-u", "nobody"], capture_output=True,
                                                    text=True, check=True).stdout)


def test_unknown_master_user_is_named(master_dir: Path) -> None:
    client = SaltMasterClient(write_config(master_dir, "no-such-salt-user"))
    with pytest.raises(SaltError, match="master.s user .no-such-salt-user."):
        client.issue_token("store-0001-vm")
