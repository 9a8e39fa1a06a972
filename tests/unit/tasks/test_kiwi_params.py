"""tasks/kiwi/params.py: build parameters and minion.d rendering (lab/image_builder.py's
render_minion_d, from the shipped parts), and that the image's own apply-build-params helper
(run by config.sh) renders the same files."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from lab.image_builder import render_minion_d
from tasks.kiwi import (
    BUILD_PARAMS_FILE,
    BuildParamsError,
    KiwiBuilder,
    resolve_params,
)
from tests.kiwi_helpers import (
    DEBIAN,
    LEAP,
    MINION_D,
    OVERLAY,
    PARAMS,
    copy_description,
    desc_dir,
)


def test_render_minion_d_substitutes_params() -> None:
    files = render_minion_d(desc_dir(LEAP), {"SALT_MASTER": "salt.store-042.example"})
    assert sorted(files) == ["00-master.conf", "10-grains.conf", "20-autosign.conf",
                             "30-data-disk.conf", "40-link.conf", "90-bootstrap.conf"]  # fmt: skip
    assert all("@" not in text for text in files.values())
    data = {name: yaml.safe_load(text) for name, text in files.items()}
    assert data["00-master.conf"] == {"master": "salt.store-042.example", "master_port": "4506"}
    assert data["10-grains.conf"]["grains"]["role"] == "store-server"
    # an image built without a version says so (tasks/kiwi/params.py DEFAULT_PARAMS)
    assert data["10-grains.conf"]["grains"]["store_image_version"] == "unversioned"
    assert render_minion_d(desc_dir(LEAP), {"SALT_MASTER": "m", "IMAGE_VERSION": "v2"})[
        "10-grains.conf"].count('store_image_version: "v2"') == 1
    # the minion's keys live on the data disk, beside the identity store-identity keeps there
    assert data["30-data-disk.conf"] == {"pki_dir": "/srv/store/.identity/pki/minion"}
    assert "store_rollout_token" in data["20-autosign.conf"]["autosign_grains"]
    assert data["90-bootstrap.conf"]["startup_states"] == "sls"
    assert "provisioning_helper.firstboot" in data["90-bootstrap.conf"]["sls_list"]
    # both descriptions carry the same files
    assert (
        render_minion_d(desc_dir(DEBIAN), {"SALT_MASTER": "salt.store-042.example"})
        == files
    )
    # the overlay itself is untouched
    assert '"@SALT_MASTER@"' in (OVERLAY / "etc/salt/minion.d/00-master.conf").read_text()


@pytest.mark.parametrize(
    ("params", "needle"),
    [({}, "no value for @SALT_MASTER@"),
     ({"SALT_MASTER": 'evil"\nmaster_type: disable'}, "parameter SALT_MASTER="),
     ({"SALT_MASTER": "x", "bad-key": "1"}, "parameter name 'bad-key'")],
)  # fmt: skip
def test_render_minion_d_rejects_bad_params(params: dict[str, str], needle: str) -> None:
    with pytest.raises(BuildParamsError, match=re.escape(needle)):
        render_minion_d(desc_dir(LEAP), params)


def test_config_sh_helper_renders_like_python(tmp_path: Path) -> None:
    """apply-build-params (run by config.sh in the image) == render_minion_d."""
    desc = copy_description(LEAP, tmp_path)
    # what the image cache hands the builder: the parameters with their defaults
    KiwiBuilder.prepare_description(desc_dir(LEAP), resolve_params(desc_dir(LEAP), PARAMS),
                                    tmp_path / "copy")
    params_file = tmp_path / "copy/root" / BUILD_PARAMS_FILE
    assert params_file.read_text().splitlines()[1:] == ["IMAGE_VERSION=unversioned",
                                                        "SALT_MASTER=10.20.0.1",
                                                        "SALT_MASTER_PORT=4506"]  # fmt: skip
    minion_d = tmp_path / "copy" / MINION_D
    helper = desc / "root/usr/local/libexec/store-rollout/apply-build-params"
    env = {"PATH": os.environ["PATH"]}
    subprocess.run([str(helper), str(params_file), str(minion_d)], check=True, env=env)
    rendered = {p.name: p.read_text() for p in sorted(minion_d.iterdir())}
    assert rendered == render_minion_d(desc_dir(LEAP), PARAMS)
    # image_builds/ itself untouched, and a missing value fails the build
    assert not (OVERLAY / BUILD_PARAMS_FILE).exists()
    proc = subprocess.run([str(helper), str(tmp_path / "none"), str(desc / MINION_D)],
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1 and "no value for @SALT_MASTER@" in proc.stderr
