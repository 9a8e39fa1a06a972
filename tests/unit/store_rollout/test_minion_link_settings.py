"""The minion's link settings (store_rollout/contracts.py MINION_LINK_SETTINGS): each a minion
option Salt 3006.0 (the store hosts' SUSE Salt, .venv-host-py36), 3006 (the Salt Bundle's line,
.venv-salt3006) and 3008 (.venv) know, of the type of its default; and every place that ships them
carries exactly these values, read as the minion reads them: the store VM image's minion.d (KIWI
overlay, the lab image's render_minion_d), the AutoYaST and Agama profiles as Cobbler renders
them, and the lab's installed hosts (what the simulator's hypervisor minions start with)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.agama import parse_profile
from lab.image_builder import render_minion_d
from lab.simulator.installed_host import installed_minion
from store_rollout.contracts import MINION_CONF_DIR, MINION_LINK_CONF, MINION_LINK_SETTINGS
from tests.helpers import REPO_ROOT, cannot_run
from tests.kiwi_helpers import DEBIAN, LEAP, OVERLAY, desc_dir
from tests.unit.lab.agama_rules import problems
from tests.unit.lab.test_agama_profile import (  # _snippets: its module fixture, the snippets dir
    AUTOYAST,
    BUNDLE,
    STATIC,
    _snippets,  # noqa: F401
    files,
    render_text,
)
from tests.unit.lab.test_agama_profile import profile as agama_profile

SALTS = {"3008": ".venv", "3006": ".venv-salt3006", "3006.0": ".venv-host-py36"}
# Salt's own defaults and its own reading of a minion.d holding only the link file (no master
# contacted: minion_config only reads files); Python 3.6 syntax for the host's Salt 3006.0
READ_BY_SALT = """
import json, os, sys
import salt.config, salt.version
conf = sys.argv[1]
opts = salt.config.minion_config(os.path.join(conf, "minion"))
keys = json.loads(sys.argv[2])
print(json.dumps({"version": salt.version.__version__,
                  "defaults": {k: salt.config.DEFAULT_MINION_OPTS.get(k, "<unknown>") for k in keys},
                  "read": {k: opts.get(k) for k in keys}}))
"""


def salt_reads(venv: str, tmp_path: Path, text: str) -> dict[str, Any]:
    python = REPO_ROOT / venv / "bin" / "python"
    if not python.exists():
        cannot_run(f"{python} missing: `make setup` builds {venv}")
    conf = tmp_path / venv.strip(".")
    (conf / "minion.d").mkdir(parents=True)
    (conf / "minion").write_text("")
    (conf / "minion.d" / MINION_LINK_CONF).write_text(text)
    proc = subprocess.run([str(python), "-c", READ_BY_SALT, str(conf),
                           json.dumps(sorted(MINION_LINK_SETTINGS))],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return answer


def shipped_conf() -> str:
    return (OVERLAY / "etc" / "salt" / MINION_CONF_DIR / MINION_LINK_CONF).read_text()


@pytest.mark.parametrize("salt", SALTS)
def test_each_setting_is_a_minion_option_salt_knows_and_reads_as_written(
        salt: str, tmp_path: Path) -> None:
    answer = salt_reads(SALTS[salt], tmp_path, shipped_conf())
    assert answer["version"].startswith(salt), answer["version"]
    unknown = [k for k, v in answer["defaults"].items() if v == "<unknown>"]
    assert unknown == [], f"Salt {answer['version']} has no minion option {unknown}"
    wrong_type = {k: (v, answer["defaults"][k]) for k, v in MINION_LINK_SETTINGS.items()
                  if type(v) is not type(answer["defaults"][k])}
    assert wrong_type == {}, f"not of the type of Salt's default: {wrong_type}"
    # Salt's own reading of the shipped file: every value as the contract says, none defaulted
    assert answer["read"] == MINION_LINK_SETTINGS
    changed = [k for k, v in MINION_LINK_SETTINGS.items() if answer["defaults"][k] != v]
    assert len(changed) >= 10, changed  # the defaults are LAN settings: most are changed


def test_the_vm_images_minion_d_carries_the_contract() -> None:
    assert yaml.safe_load(shipped_conf()) == MINION_LINK_SETTINGS
    for description in (LEAP, DEBIAN):  # the KIWI images and the lab's image
        rendered = render_minion_d(desc_dir(description), {"SALT_MASTER": "10.0.0.5"})
        assert yaml.safe_load(rendered[MINION_LINK_CONF]) == MINION_LINK_SETTINGS


def test_the_autoyast_profile_carries_the_contract() -> None:
    text = render_text(AUTOYAST, {**STATIC, "virt_uri": "xen:///system"})
    installed = parse_profile(text)
    assert installed.installer == "autoyast"
    written = installed.files[f"/etc/salt/{MINION_CONF_DIR}/{MINION_LINK_CONF}"]
    assert yaml.safe_load(written) == MINION_LINK_SETTINGS
    # the lab's hypervisor minion starts with it (lab/simulator/installed_host.py)
    assert yaml.safe_load(installed_minion(installed.files, "autoyast").minion_d[
        MINION_LINK_CONF]) == MINION_LINK_SETTINGS


def test_the_agama_profile_carries_the_contract_and_still_follows_agamas_rules() -> None:
    written = files("static")[f"{BUNDLE}/{MINION_CONF_DIR}/{MINION_LINK_CONF}"]
    assert yaml.safe_load(written) == MINION_LINK_SETTINGS
    assert problems(agama_profile("static")) == []
    permissions = {f["destination"]: f["permissions"] for f in agama_profile("static")["files"]}
    assert permissions[f"{BUNDLE}/{MINION_CONF_DIR}/{MINION_LINK_CONF}"] == "0644"  # no secret


@pytest.mark.parametrize("platform", ["sles15-xen", "sle16-kvm"])
def test_the_hypervisor_formula_manages_the_text_the_profiles_wrote(platform: str) -> None:
    """hypervisor.link keeps the file on hosts installed before it (a change restarts their
    minion once); on a host the profile installed it finds the same text and changes nothing
    (its render is the snapshot tests/unit/salt_states/test_salt_render.py keeps current)."""
    rendered = json.loads((REPO_ROOT / "tests" / "snapshots" / f"hypervisor-{platform}.json")
                          .read_text())
    managed = {k: v for arg in rendered["hypervisor-link-init-file-managed"]["file"]
               if isinstance(arg, dict) for k, v in arg.items()}
    assert managed["name"].endswith(f"/{MINION_CONF_DIR}/{MINION_LINK_CONF}")
    assert yaml.safe_load(managed["contents"]) == MINION_LINK_SETTINGS
    autoyast = parse_profile(render_text(AUTOYAST, {**STATIC, "virt_uri": "xen:///system"}))
    assert managed["contents"] == autoyast.files[f"/etc/salt/{MINION_CONF_DIR}/{MINION_LINK_CONF}"]
    assert managed["contents"] == files("static")[f"{BUNDLE}/{MINION_CONF_DIR}/{MINION_LINK_CONF}"]
