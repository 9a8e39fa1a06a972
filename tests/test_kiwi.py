"""tasks/kiwi.py: KIWI validation of the real descriptions, image keys, minion.d rendering,
the image cache, and (opt-in, root) a real kiwi-ng build booted under qemu."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from salt.exceptions import CommandExecutionError

from tasks.kiwi import (
    BUILD_PARAMS_FILE,
    IDENTITY_SCRIPT,
    IMAGE_BUILDS_DIR,
    BuildOutput,
    BuildParamsError,
    ImageCache,
    KiwiBuilder,
    KiwiDescriptionError,
    LabBuilder,
    ensure_image,
    image_key,
    render_minion_d,
    validate_description,
)
from tests.helpers import load_salt_module

PARAMS = {"SALT_MASTER": "10.20.0.1", "SALT_MASTER_PORT": "4506"}
OVERLAY = IMAGE_BUILDS_DIR / "overlays" / "salt-minion"
MINION_D = Path("root/etc/salt/minion.d")
LEAP, DEBIAN = "leap-jeos", "lab-debian"
PROFILE = {LEAP: None, DEBIAN: "Disk"}


# --------------------------------------------------------------------------- helpers


def copy_description(name: str, tmp_path: Path) -> Path:
    """A private copy with root/ resolved into a real directory (mutations stay local)."""
    dest = tmp_path / name
    shutil.copytree(IMAGE_BUILDS_DIR / name, dest, symlinks=False)
    return dest


def copy_tree_with_links(tmp_path: Path) -> Path:
    """image_builds/ copied with its relative symlinks kept (root -> ../overlays/...)."""
    dest = tmp_path / "image_builds"
    shutil.copytree(IMAGE_BUILDS_DIR, dest, symlinks=True)
    assert (dest / LEAP / "root").is_symlink()
    return dest


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, count))


def problems_of(desc: Path, profile: str | None) -> str:
    with pytest.raises(KiwiDescriptionError) as info:
        validate_description(desc, profile)
    assert isinstance(info.value, ValueError)
    assert str(desc) in str(info.value)
    return "\n".join(info.value.problems)


# --------------------------------------------------------------------------- valid descriptions


def test_leap_jeos_validates_with_kiwi() -> None:
    info = validate_description(IMAGE_BUILDS_DIR / LEAP, None)
    assert info.name == "leap156-jeos-store-server"
    assert info.version == "15.6.0"
    assert (info.image_type, info.format) == ("oem", "qcow2")
    assert {"salt-minion", "util-linux", "dracut-kiwi-oem-repart"} <= set(info.packages)


def test_lab_debian_validates_with_kiwi_profile_disk() -> None:
    info = validate_description(IMAGE_BUILDS_DIR / DEBIAN, "Disk")
    assert info.profiles == ["Disk"]
    assert (info.image_type, info.format) == ("oem", "qcow2")
    assert {"util-linux", "linux-image-amd64", "grub-pc"} <= set(info.packages)
    assert "salt-minion" not in info.packages  # not in Debian 12's archive
    xml = (IMAGE_BUILDS_DIR / DEBIAN / "config.xml").read_text()
    assert 'path="http://deb.debian.org/debian"' in xml


def test_descriptions_share_one_overlay_and_scripts_are_sane() -> None:
    for name in (LEAP, DEBIAN):
        root = IMAGE_BUILDS_DIR / name / "root"
        assert root.is_symlink() and os.readlink(root) == "../overlays/salt-minion"
        config_sh = IMAGE_BUILDS_DIR / name / "config.sh"
        assert config_sh.stat().st_mode & 0o777 == 0o755
        subprocess.run(["bash", "-n", str(config_sh)], check=True)
    xml = (IMAGE_BUILDS_DIR / LEAP / "config.xml").read_text()
    assert 'schemaversion="8.5"' in xml and 'image="oem"' in xml and 'format="qcow2"' in xml


def test_copy_of_description_validates(tmp_path: Path) -> None:
    for name in (LEAP, DEBIAN):
        validate_description(copy_description(name, tmp_path), PROFILE[name])


def test_validation_writes_nothing_to_var_tmp(tmp_path: Path) -> None:
    before = set(os.listdir("/var/tmp"))
    validate_description(IMAGE_BUILDS_DIR / LEAP, None, temp_dir=tmp_path / "kt")
    assert set(os.listdir("/var/tmp")) == before


# --------------------------------------------------------------------------- broken variants


def _typo_packages(d: Path) -> None:
    edit(d / "config.xml", '<packages type="bootstrap">', '<pacakges type="bootstrap">')
    edit(d / "config.xml", "</packages>\n</image>", "</pacakges>\n</image>")


def _bad_attribute(d: Path) -> None:
    edit(d / "config.xml", 'filesystem="', 'fileystem="')


def _vmx(d: Path) -> None:
    edit(d / "config.xml", 'image="oem"', 'image="vmx"')


def _no_version(d: Path) -> None:
    text = (d / "config.xml").read_text()
    (d / "config.xml").write_text(re.sub(r"<version>.*</version>", "", text))


def _no_repository(d: Path) -> None:
    text = (d / "config.xml").read_text()
    (d / "config.xml").write_text(re.sub(r"<repository .*?</repository>", "", text, flags=re.S))


def _no_repart(d: Path) -> None:
    edit(d / "config.xml", '<package name="dracut-kiwi-oem-repart"/>', "")


def _config_sh_syntax(d: Path) -> None:
    with (d / "config.sh").open("a") as fh:
        fh.write('if [ -f /etc/os-release ]; then\n  echo "unterminated\n')


def _config_sh_not_executable(d: Path) -> None:
    (d / "config.sh").chmod(0o644)


def _overlay_yaml_broken(d: Path) -> None:
    (d / MINION_D / "10-grains.conf").write_text("grains:\n  role: [store-server\n")


def _overlay_no_sls_list(d: Path) -> None:
    edit(d / MINION_D / "90-bootstrap.conf", "sls_list:\n  - provisioning_helper.firstboot\n", "")


def _overlay_unquoted_placeholder(d: Path) -> None:
    edit(d / MINION_D / "00-master.conf", 'master: "@SALT_MASTER@"', "master: @SALT_MASTER@")


def _overlay_no_master(d: Path) -> None:
    edit(d / MINION_D / "00-master.conf", 'master: "@SALT_MASTER@"\n', "")


def _overlay_startup_elsewhere(d: Path) -> None:
    (d / MINION_D / "90-bootstrap.conf").unlink()
    (d / MINION_D / "30-startup.conf").write_text(
        "startup_states: sls\nsls_list: [provisioning_helper.firstboot]\n"
    )


def _no_util_linux(d: Path) -> None:
    edit(d / "config.xml", '<package name="util-linux"/>', "")


def _no_identity_unit(d: Path) -> None:
    (d / "root/etc/systemd/system/store-identity.service").unlink()


def _tbz_with_format(d: Path) -> None:
    edit(d / "config.xml", '<type image="tbz"/>', '<type image="tbz" format="qcow2"/>')


def _console_attr(d: Path) -> None:
    edit(d / "config.xml", 'output_console="serial" input_console="serial"', 'console="serial"')


def _zfs(d: Path) -> None:
    edit(d / "config.xml", 'filesystem="ext4"', 'filesystem="zfs"')


def _unknown_profile(d: Path) -> None:
    edit(d / "config.xml", 'import="true"', "")  # no default profile any more


BROKEN: list[tuple[str, str, Callable[[Path], None], list[str]]] = [
    # description, id, mutation, texts the problem list must contain
    (LEAP, "element-typo", _typo_packages,
     ["config.xml", "Element image has extra content: pacakges", "/image/pacakges"]),
    (LEAP, "bad-attribute", _bad_attribute,
     ["Invalid attribute fileystem for element type", "/image/preferences/type"]),
    (LEAP, "image-vmx", _vmx,
     ["format attribute is only available for the following image types: oem"]),
    (LEAP, "no-version", _no_version, ["KiwiRuntimeError", "No version is defined"]),
    (LEAP, "no-repository", _no_repository, ["KiwiRuntimeError", "No repositories configured"]),
    (LEAP, "oem-resize-no-repart", _no_repart,
     ["Required dracut module package missing", "dracut-kiwi-oem-repart"]),
    (LEAP, "config-sh-syntax", _config_sh_syntax, ["config.sh: bash -n:", "unexpected"]),
    (LEAP, "config-sh-mode", _config_sh_not_executable, ["config.sh: not executable"]),
    (LEAP, "overlay-yaml", _overlay_yaml_broken, ["10-grains.conf: not valid YAML"]),
    (LEAP, "overlay-no-sls-list", _overlay_no_sls_list,
     ["minion.d: 'sls_list' must contain provisioning_helper.firstboot"]),
    (LEAP, "overlay-unquoted-placeholder", _overlay_unquoted_placeholder,
     ["00-master.conf: not valid YAML (quote placeholders"]),
    (LEAP, "overlay-startup-elsewhere", _overlay_startup_elsewhere,
     ["30-startup.conf: 'startup_states' must live in 90-bootstrap.conf"]),
    (LEAP, "no-util-linux", _no_util_linux, ["<packages type=\"image\"> lacks util-linux"]),
    (LEAP, "no-identity-unit", _no_identity_unit, ["store-identity.service: missing"]),
    (DEBIAN, "element-typo", _typo_packages, ["Element image has extra content: pacakges"]),
    (DEBIAN, "tbz-with-format", _tbz_with_format,
     ["format attribute is only available for the following image types: oem"]),
    (DEBIAN, "filesystem-zfs", _zfs, ["Invalid attribute filesystem for element type"]),
    (DEBIAN, "console-8.5", _console_attr,
     ["Element type failed to validate content", "type/bootloader"]),
    (DEBIAN, "no-version", _no_version, ["No version is defined"]),
    (DEBIAN, "no-repository", _no_repository, ["No repositories configured"]),
    (DEBIAN, "config-sh-syntax", _config_sh_syntax, ["config.sh: bash -n:"]),
    (DEBIAN, "overlay-no-master", _overlay_no_master, ["no file sets 'master'"]),
    (DEBIAN, "overlay-yaml", _overlay_yaml_broken, ["10-grains.conf: not valid YAML"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "mutate", "expected"),
    [pytest.param(n, m, e, id=f"{n}-{i}") for n, i, m, e in BROKEN],
)
def test_broken_description_gives_specific_error(
    name: str, mutate: Callable[[Path], None], expected: list[str], tmp_path: Path
) -> None:
    desc = copy_description(name, tmp_path)  # an unmodified copy validates: see test_copy_...
    mutate(desc)
    text = problems_of(desc, PROFILE[name])
    for needle in expected:
        assert needle in text, f"{needle!r} not in:\n{text}"


def test_profile_needed_when_no_default(tmp_path: Path) -> None:
    desc = copy_description(DEBIAN, tmp_path)
    _unknown_profile(desc)
    text = problems_of(desc, None)
    assert "KiwiTypeNotFound" in text and "profiles declared: Tbz, Disk" in text
    validate_description(desc, "Disk")


def test_at_least_five_broken_variants_each() -> None:
    for name in (LEAP, DEBIAN):
        assert sum(1 for n, *_ in BROKEN if n == name) >= 5


# --------------------------------------------------------------------------- image_key


def test_image_key_stable_and_sensitive_to_overlay_and_params(tmp_path: Path) -> None:
    tree = copy_tree_with_links(tmp_path)
    desc = tree / LEAP
    k1 = image_key(desc, PARAMS)
    assert k1 == image_key(desc, PARAMS) == image_key(desc, dict(reversed(PARAMS.items())))
    assert re.fullmatch(r"[0-9a-f]{64}", k1)
    # same tree content elsewhere -> same key (relative paths only)
    assert image_key(IMAGE_BUILDS_DIR / LEAP, PARAMS) == k1
    # defaults are applied before hashing
    assert image_key(desc, {"SALT_MASTER": "10.20.0.1"}) == k1

    assert image_key(desc, {**PARAMS, "SALT_MASTER": "10.20.0.2"}) != k1
    assert image_key(desc, {**PARAMS, "LAB_DISK_SIZE": "128M"}) != k1
    assert image_key(desc, PARAMS, builder="lab-v1") != k1

    # one shared overlay file changes -> the key of BOTH descriptions changes
    k_debian = image_key(tree / DEBIAN, PARAMS)
    conf = tree / "overlays/salt-minion/etc/salt/minion.d/10-grains.conf"
    edit(conf, "role: store-server", "role: store-server-x")
    k2 = image_key(desc, PARAMS)
    assert k2 != k1 and image_key(tree / DEBIAN, PARAMS) != k_debian
    # a mode change counts too
    conf.chmod(0o600)
    assert image_key(desc, PARAMS) != k2


# --------------------------------------------------------------------------- render_minion_d


def test_render_minion_d_substitutes_params() -> None:
    files = render_minion_d(IMAGE_BUILDS_DIR / LEAP, {"SALT_MASTER": "salt.store-042.example"})
    assert sorted(files) == ["00-master.conf", "10-grains.conf", "20-autosign.conf",
                             "90-bootstrap.conf"]  # fmt: skip
    assert all("@" not in text for text in files.values())
    data = {name: yaml.safe_load(text) for name, text in files.items()}
    assert data["00-master.conf"] == {"master": "salt.store-042.example", "master_port": "4506"}
    assert data["10-grains.conf"]["grains"]["role"] == "store-server"
    assert "store_rollout_token" in data["20-autosign.conf"]["autosign_grains"]
    assert data["90-bootstrap.conf"]["startup_states"] == "sls"
    assert "provisioning_helper.firstboot" in data["90-bootstrap.conf"]["sls_list"]
    # both descriptions carry the same files
    assert (
        render_minion_d(IMAGE_BUILDS_DIR / DEBIAN, {"SALT_MASTER": "salt.store-042.example"})
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
        render_minion_d(IMAGE_BUILDS_DIR / LEAP, params)


def test_config_sh_helper_renders_like_python(tmp_path: Path) -> None:
    """apply-build-params (run by config.sh in the image) == render_minion_d."""
    desc = copy_description(LEAP, tmp_path)
    KiwiBuilder.prepare_description(IMAGE_BUILDS_DIR / LEAP, PARAMS, tmp_path / "copy")
    params_file = tmp_path / "copy/root" / BUILD_PARAMS_FILE
    assert params_file.read_text().splitlines()[1:] == ["SALT_MASTER=10.20.0.1",
                                                        "SALT_MASTER_PORT=4506"]  # fmt: skip
    minion_d = tmp_path / "copy" / MINION_D
    helper = desc / "root/usr/local/libexec/store-rollout/apply-build-params"
    env = {"PATH": os.environ["PATH"]}
    subprocess.run([str(helper), str(params_file), str(minion_d)], check=True, env=env)
    rendered = {p.name: p.read_text() for p in sorted(minion_d.iterdir())}
    assert rendered == render_minion_d(IMAGE_BUILDS_DIR / LEAP, PARAMS)
    # image_builds/ itself untouched, and a missing value fails the build
    assert not (OVERLAY / BUILD_PARAMS_FILE).exists()
    proc = subprocess.run([str(helper), str(tmp_path / "none"), str(desc / MINION_D)],
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1 and "no value for @SALT_MASTER@" in proc.stderr


def _storevirt() -> ModuleType:
    return load_salt_module("_modules", "storevirt")


def _seed_content(iso: Path, dest: Path) -> Path:
    """The seed as the guest sees it once mounted (xorriso extracts instead of a loop mount)."""
    subprocess.run(["xorriso", "-osirrox", "on", "-indev", str(iso), "-extract", "/", str(dest)],
                   check=True, capture_output=True)  # fmt: skip
    return dest


def test_store_identity_script_reads_the_seed_disk(tmp_path: Path) -> None:
    """The hypervisor's seed ISO (storevirt.write_seed) and the image's store-identity agree:
    label, file name, keys, values; the guest never executes the seed."""
    storevirt = _storevirt()
    script = (OVERLAY / IDENTITY_SCRIPT).read_text()
    assert f"SEED_LABEL={storevirt.SEED_LABEL}\n" in script
    assert f"SEED_FILE={storevirt.SEED_FILE}\n" in script
    for key in storevirt.SEED_KEYS:
        assert f"{key})" in script, key
    iso = Path(storevirt.write_seed(str(tmp_path / "vm" / "seed.iso"), {
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
    from tasks.salt_master import new_autosign_token

    storevirt = _storevirt()
    guest = re.search(r"^VALID='(.+)'$", (OVERLAY / IDENTITY_SCRIPT).read_text(), re.M)
    assert guest is not None
    for _ in range(2000):
        token = new_autosign_token()
        assert storevirt._seed_text({"minion_id": "m", "autosign_token": token})
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
    storevirt = _storevirt()
    with pytest.raises(CommandExecutionError, match=re.escape(message)):
        storevirt.write_seed(str(tmp_path / "seed.iso"), identity)
    assert not list(tmp_path.iterdir())  # nothing half-written


# --------------------------------------------------------------------------- ImageCache


class CountingLabBuilder(LabBuilder):
    """LabBuilder that counts build() calls and can be slowed down to widen races."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.calls = 0
        self.delay = delay
        self._lock = threading.Lock()

    def build(self, desc_dir: Path, params: Mapping[str, str], work_dir: Path,
              log: Callable[[str], None]) -> BuildOutput:  # fmt: skip
        with self._lock:
            self.calls += 1
        time.sleep(self.delay)
        return super().build(desc_dir, params, work_dir, log)


def test_cache_miss_then_hit_without_kiwi(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path / "cache")
    builder = CountingLabBuilder()
    first = cache.ensure(IMAGE_BUILDS_DIR / DEBIAN, {**PARAMS, "KIWI_PROFILE": "Disk"}, builder)
    assert not first.cache_hit and builder.calls == 1 and first.kiwi_seconds > 0
    assert first.path == tmp_path / "cache" / first.key / "image.qcow2"

    info = json.loads(subprocess.run(
        ["qemu-img", "info", "--output=json", str(first.path)],
        check=True, capture_output=True, text=True).stdout)  # fmt: skip
    assert info["format"] == "qcow2" and info["virtual-size"] == 64 * 1024 * 1024

    meta = json.loads((first.path.parent / "meta.json").read_text())
    assert meta["key"] == first.key and meta["description"] == DEBIAN
    assert meta["params"]["SALT_MASTER"] == "10.20.0.1" and meta["builder"] == "lab-v1"
    assert {"built_at", "build_seconds", "kiwi_result"} <= set(meta)
    assert meta["kiwi_result"]["validated"]["name"] == "lab-debian12-store-server"

    second = cache.ensure(IMAGE_BUILDS_DIR / DEBIAN, {**PARAMS, "KIWI_PROFILE": "Disk"}, builder)
    assert second.cache_hit and second.key == first.key and second.path == first.path
    assert builder.calls == 1 and second.kiwi_seconds == 0 and second.build_seconds == 0
    # nothing left behind but the entry and its lock
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        first.key,
        f"{first.key}.lock",
    ]


def test_cache_concurrent_ensure_builds_once(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path / "cache")
    builder = CountingLabBuilder(delay=0.5)
    barrier = threading.Barrier(2)
    refs = []

    def run() -> None:
        barrier.wait()
        refs.append(cache.ensure(IMAGE_BUILDS_DIR / LEAP, PARAMS, builder))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert builder.calls == 1
    assert sorted(r.cache_hit for r in refs) == [False, True]
    assert refs[0].path == refs[1].path and refs[0].path.is_file()


def test_cache_failed_build_leaves_no_entry(tmp_path: Path) -> None:
    desc = copy_description(LEAP, tmp_path)
    _no_version(desc)
    cache = ImageCache(tmp_path / "cache")
    with pytest.raises(KiwiDescriptionError, match="No version is defined"):
        cache.ensure(desc, PARAMS, LabBuilder())
    assert [p.suffix for p in (tmp_path / "cache").iterdir()] == [".lock"]


def test_cache_rejects_missing_params_before_building(tmp_path: Path) -> None:
    builder = CountingLabBuilder()
    with pytest.raises(BuildParamsError, match="no value for @SALT_MASTER@"):
        ImageCache(tmp_path / "cache").ensure(IMAGE_BUILDS_DIR / LEAP, {}, builder)
    assert builder.calls == 0


def test_ensure_image_is_a_named_prefect_task() -> None:
    assert ensure_image.task_run_name == "image-{description}"
    assert list(ensure_image.fn.__annotations__) == [
        "description", "params", "cache_dir", "builder", "return"]  # fmt: skip


def test_kiwi_builder_command_line(tmp_path: Path) -> None:
    b = KiwiBuilder(shared_cache_dir=tmp_path / "shared", kiwi_ng="kiwi-ng")
    cmd = b.command(tmp_path / "desc", "Disk", tmp_path / "work")
    assert cmd[:3] == ["kiwi-ng", "--profile", "Disk"]
    assert cmd.index("system") > cmd.index("--shared-cache-dir") > cmd.index("--logfile")
    assert cmd[cmd.index("--temp-dir") + 1] == str(tmp_path / "work/kiwi-tmp")
    assert cmd[-4:] == ["--description", str(tmp_path / "desc"),
                        "--target-dir", str(tmp_path / "work/target")]  # fmt: skip


# --------------------------------------------------------------------------- real build (opt-in)


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def mounted_root(tmp_path: Path) -> Iterator[Callable[[Path], Path]]:
    """Mount a raw disk image read-only; umount/partx -d/losetup -d even on failure."""
    cleanup: list[list[str]] = []

    def mount(raw: Path) -> Path:
        loop = _run("losetup", "-r", "-f", "--show", str(raw))
        cleanup.append(["losetup", "-d", loop])
        subprocess.run(["partx", "-a", loop], check=False, capture_output=True)
        cleanup.append(["partx", "-d", loop])
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        for part in sorted(Path("/dev").glob(f"{Path(loop).name}p*")):
            if subprocess.run(["mount", "-o", "ro", str(part), str(mnt)],
                              capture_output=True).returncode != 0:  # fmt: skip
                continue
            if (mnt / "etc/salt/minion.d").is_dir():
                cleanup.append(["umount", str(mnt)])
                return mnt
            subprocess.run(["umount", str(mnt)], check=True)
        raise AssertionError(f"no partition of {raw} holds etc/salt/minion.d")

    try:
        yield mount
    finally:
        for cmd in reversed(cleanup):
            subprocess.run(cmd, check=False, capture_output=True)


def _wait_for(proc: subprocess.Popen[bytes], needle: bytes, timeout: float) -> bytes:
    assert proc.stdout is not None
    out = b""
    deadline = time.monotonic() + timeout
    while needle not in out:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or proc.poll() is not None:
            raise AssertionError(f"no {needle!r} within {timeout} s; console tail:\n"
                                 f"{out[-3000:].decode(errors='replace')}")  # fmt: skip
        ready, _, _ = select.select([proc.stdout], [], [], min(remaining, 1.0))
        if ready:
            out += os.read(proc.stdout.fileno(), 65536)
    return out


@pytest.mark.kiwi_build
@pytest.mark.timeout(1800)
def test_real_kiwi_build_of_lab_debian_boots(
    tmp_path: Path, mounted_root: Callable[[Path], Path]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("kiwi-ng system build needs root (loop devices, chroot, mounts)")
    for tool in ("qemu-system-x86_64", "losetup", "partx", "rsync"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    cache_dir = Path(os.environ.get("STORE_ROLLOUT_KIWI_TEST_CACHE", tmp_path / "cache"))
    params = {**PARAMS, "KIWI_PROFILE": "Disk"}
    builder = KiwiBuilder(shared_cache_dir=cache_dir / "_kiwi-shared-cache")
    lines: list[str] = []
    ref = ImageCache(cache_dir).ensure(IMAGE_BUILDS_DIR / DEBIAN, params, builder,
                                       log=lines.append)  # fmt: skip
    assert ref.path.is_file()
    assert json.loads(_run("qemu-img", "info", "--output=json", str(ref.path)))["format"] == "qcow2"

    # minion.d inside the image == render_minion_d, mode 0640, build-only files gone
    raw = tmp_path / "disk.raw"
    _run("qemu-img", "convert", "-O", "raw", str(ref.path), str(raw))
    root = mounted_root(raw)
    minion_d = root / "etc/salt/minion.d"
    expected = render_minion_d(IMAGE_BUILDS_DIR / DEBIAN, params)
    assert {p.name: p.read_text() for p in minion_d.iterdir()} == expected
    assert all(p.stat().st_mode & 0o777 == 0o640 for p in minion_d.iterdir())
    assert (root / "usr/local/sbin/store-identity").is_file()
    assert not (root / BUILD_PARAMS_FILE).exists()
    assert not (root / "etc/salt/minion_id").exists()

    # boot a throwaway overlay under TCG to the login prompt
    disk = tmp_path / "boot.qcow2"
    _run("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(ref.path),
         str(disk))  # fmt: skip
    qemu = subprocess.Popen(
        ["qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", "1024", "-smp", "2",
         "-nographic", "-no-reboot", "-nic", "none",
         "-drive", f"file={disk},if=virtio,format=qcow2",
         "-smbios", "type=11,value=store_rollout.minion_id=kiwi-test-vm"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_for(qemu, b"login:", 300)
    finally:
        qemu.kill()
        qemu.wait(30)
