"""The network installer's profile readers (lab/installer/agama.awk for Agama's JSON,
profile.awk for AutoYaST's XML) run as the installer runs them: by the initrd's busybox awk,
into a target directory and a scripts directory, compared byte for byte with what Python's own
readers (json, lab.autoyast) make of the same profile."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from lab import netboot
from lab.autoyast import parse_autoyast
from lab.state import IMAGE_BUILDS_DIR, SALT_STATES_DIR
from store_rollout.contracts import LIBVIRT_EVENTS_ENGINE
from store_rollout.platforms import PLATFORMS
from tests.helpers import cannot_run
from tests.unit.lab.test_netboot import NOPXE
from tests.unit.lab.test_netboot import PROFILE as AUTOYAST_PROFILE
from tests.unit.salt_states.test_salt_render import COBBLER_PYTHON, COBBLER_RENDER

# written by hand: every escape JSON has, a file whose text is JSON itself, raw UTF-8 and
# \u escapes (a surrogate pair among them), a non-chrooted script (Cobbler's nopxe) between two
# chrooted ones (one chrooted by Agama's default), the deprecated `body`
AGAMA_PROFILE = r"""
  {
  "product": {"id": "SLES", "registrationUrl": "http://rmt.invalid"},
  "root": {"hashedPassword": true, "password": "$6$x$y"},
  "files": [
    {
      "destination": "/etc/salt/minion.d/50-store-rollout.conf",
      "content": "master: '10.77.0.1'\nid: \"store-nb-hv\"\ngrains:\n  store_rollout_token: 'a\\b\"c'\n",
      "permissions": "0600", "user": "root", "group": "root"
    },
    {"destination": "/etc/store/config.json",
     "content": "{\"quote\": \"\\\"\", \"slash\": \"\/\", \"tab\":\t\"\\t\"}\r\n\b\f",
     "permissions": "640"},
    {"destination" : "/etc/store/unicode.txt",
     "content": "\u0041\u00e9\u20ac\ud83d\ude00 é€😀 \u002F\u005c\n"},
    {"destination": "/etc/salt/minion_id", "content": "store-nb-hv"},
    {"destination": "/etc/store/empty", "content": ""}
  ],
  "scripts": {
    "pre": [{"name": "pre.sh", "content": "#!/bin/sh\nexit 1\n"}],
    "post": [
      {"name": "10-enable-salt-minion.sh", "chroot": true,
       "content": "#!/bin/bash\nsystemctl enable salt-minion\n"},
      {"name": "99-cobbler-nopxe.sh", "chroot": false,
       "content": "#!/bin/sh\n[ \"$(curl -fsS \"$URL\")\" = True ] || { echo 'no' >&2; exit 1; }\n"},
      {"name": "zz-default-chroot.sh", "body": "#!/bin/sh\ntouch /must-not-run\n"},
      {"name": "after.sh", "chroot": false, "body": "#!/bin/sh\necho {\"}\\\n"}
    ],
    "init": [{"name": "first-boot.sh", "content": "#!/bin/sh\n"}]
  }
}
"""


def busybox() -> Path:
    if not netboot.BUSYBOX.exists():
        cannot_run(f"the initrd's busybox is missing ({netboot.BUSYBOX}): run `make setup`")
    return netboot.BUSYBOX


def run_reader(reader: str, profile: str | bytes, tmp_path: Path) -> tuple[
        subprocess.CompletedProcess[str], dict[str, bytes], dict[str, int], dict[str, bytes]]:
    """The reader as the installer's init runs it: (the run, the files under the target by path,
    their modes, the scripts it saved to run by file name)."""
    target, scripts = tmp_path / "target", tmp_path / "scripts"
    target.mkdir()
    scripts.mkdir()
    source = tmp_path / "profile"
    source.write_bytes(profile.encode() if isinstance(profile, str) else profile)
    run = subprocess.run([str(busybox()), "awk", "-v", f"target={target}", "-v",
                          f"scripts={scripts}", "-f", str(netboot.INSTALLER_DIR / reader),
                          str(source)], capture_output=True, text=True, timeout=60,
                         umask=0o077)  # Agama's default permissions whatever the umask
    files = {"/" + p.relative_to(target).as_posix(): p for p in target.rglob("*") if p.is_file()}
    return (run, {k: p.read_bytes() for k, p in files.items()},
            {k: p.stat().st_mode & 0o777 for k, p in files.items()},
            {p.name: p.read_bytes() for p in scripts.iterdir()})


def test_an_agama_profile_lays_down_its_files_and_saves_its_non_chrooted_scripts(
        tmp_path: Path) -> None:
    run, files, modes, scripts = run_reader("agama.awk", AGAMA_PROFILE, tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    profile = json.loads(AGAMA_PROFILE)
    assert files == {f["destination"]: f["content"].encode() for f in profile["files"]}
    # what json.loads made of the escapes, spelt out
    assert files["/etc/salt/minion.d/50-store-rollout.conf"].endswith(b"token: 'a\\b\"c'\n")
    assert files["/etc/store/config.json"] == b'{"quote": "\\"", "slash": "/", "tab":\t"\\t"}\r\n\b\f'
    assert files["/etc/store/unicode.txt"] == "Aé€😀 é€😀 /\\\n".encode()
    assert modes == {"/etc/salt/minion.d/50-store-rollout.conf": 0o600,
                     "/etc/store/config.json": 0o640, "/etc/store/unicode.txt": 0o644,
                     "/etc/salt/minion_id": 0o644, "/etc/store/empty": 0o644}
    # the scripts that run outside the installed system, in the profile's order; neither the
    # chrooted ones (explicitly or by Agama's default) nor pre or init scripts
    post = profile["scripts"]["post"]
    assert scripts == {"01-99-cobbler-nopxe.sh": post[1]["content"].encode(),
                       "02-after.sh": b'#!/bin/sh\necho {"}\\\n'}


def random_text(rng: random.Random) -> str:
    """Text a template could put in a file: ASCII with its control characters, quotes and
    backslashes, accented letters, the BMP past the surrogates, emoji (no NUL: the installer's
    awk cannot hold one, and no profile needs one)."""
    pools = ["\n\t\r\b\f\x01\x1f\x7f", '"\\/{}[]:,\'', "abc xyz 019", "éßÆ\u0100\u07ff",
             "\u0800€\ud7ff\ue000\uffff", "😀\U00010000\U0010ffff"]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randrange(0, 60)))


@pytest.mark.parametrize("ensure_ascii", [True, False], ids=["escaped", "utf8"])
def test_json_text_reads_back_as_written(tmp_path: Path, ensure_ascii: bool) -> None:
    """Python's json writes what the installer reads back, byte for byte: every character class
    as \\u escapes (surrogate pairs for the astral ones) and as raw UTF-8."""
    rng = random.Random(46)
    contents = [random_text(rng) for _ in range(40)]
    profile = {"files": [{"destination": f"/f/{n}", "content": text}
                         for n, text in enumerate(contents)]}
    run, files, _, _ = run_reader(
        "agama.awk", json.dumps(profile, ensure_ascii=ensure_ascii, indent=1), tmp_path)
    assert run.returncode == 0, run.stderr
    assert files == {f"/f/{n}": text.encode() for n, text in enumerate(contents)}


def test_an_autoyast_profile_reads_as_before(tmp_path: Path) -> None:
    run, files, modes, scripts = run_reader("profile.awk", AUTOYAST_PROFILE, tmp_path)
    assert run.returncode == 0, run.stderr
    expected = {p: t.encode() for p, t in parse_autoyast(AUTOYAST_PROFILE).files.items()
                if not p.endswith("/")}
    assert files == expected
    assert modes["/etc/salt/minion.d/50-store-rollout.conf"] == 0o600
    assert (tmp_path / "target/var/cache/salt/minion/extmods/engines").is_dir()
    # the non-chrooted script, all of its CDATA (the line break after <![CDATA[ too)
    assert scripts == {"01-99-cobbler-nopxe.sh": f"\n{NOPXE}".encode()}


# a system's blended variables, as Cobbler hands them to the template (its token with the
# characters a JSON or XML text must escape or keep apart)
SYSTEM_VARS = {"system_name": "store-nb-hv", "hostname": "store-nb-hv.stores.example",
               "minion_id": "store-nb-hv", "store_id": "nb", "http_server": "10.77.0.1:80",
               "salt_master": "10.77.0.1", "autosign_token": 'tok-"\\{a}</x>\'b',
               "install_product": "SLES", "registration_url": "https://rmt.example"}


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_each_platforms_template_as_cobbler_renders_it_reads_byte_for_byte(
        tmp_path: Path, platform: str) -> None:
    """The profile Cobbler serves for each platform (image_builds/, rendered by Cobbler's own
    template class) goes to the reader init picks for it (JSON: agama.awk), which lays down
    the files Python's reader of the same text finds, byte for byte."""
    if not COBBLER_PYTHON.exists():
        pytest.fail(f"{COBBLER_PYTHON} missing: `make setup` builds .venv-cobbler")
    snippets = tmp_path / "snippets"
    snippets.mkdir()
    engine = SALT_STATES_DIR / "_engines" / f"{LIBVIRT_EVENTS_ENGINE}.py"
    (snippets / engine.name).write_text(engine.read_text())
    template = (IMAGE_BUILDS_DIR / PLATFORMS[platform].template).read_text()
    proc = subprocess.run([str(COBBLER_PYTHON), "-c", COBBLER_RENDER], input=json.dumps(
        {"template": template, "vars": {"autoinstall_snippets_dir": str(snippets),
                                        **SYSTEM_VARS}}),
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rendered = proc.stdout
    agama_profile = rendered.lstrip().startswith("{")  # init's choice of reader
    assert agama_profile == (PLATFORMS[platform].installer == "agama"), rendered[:300]
    (tmp_path / "run").mkdir()
    run, files, _, scripts = run_reader("agama.awk" if agama_profile else "profile.awk",
                                        rendered, tmp_path / "run")
    assert run.returncode == 0, run.stderr
    if agama_profile:
        profile = json.loads(rendered)
        assert files == {f["destination"]: f["content"].encode()
                         for f in profile.get("files", [])}
        outside = [s for s in profile.get("scripts", {}).get("post", [])
                   if s.get("chroot") is False]
        assert scripts == {f"{n:02d}-{s['name']}": s.get("content", s.get("body")).encode()
                           for n, s in enumerate(outside, start=1)}
    else:
        assert files == {p: t.encode() for p, t in parse_autoyast(rendered).files.items()
                         if not p.endswith("/")}
        assert [name[3:] for name in scripts] == ["99-cobbler-nopxe.sh"]


def agama(files: str = "[]", post: str = "[]") -> str:
    return f'{{"files": {files}, "scripts": {{"post": {post}}}}}'


FILE = '{"destination": "/etc/x", "content": "x"}'
SCRIPT = '{"name": "n.sh", "chroot": false, "content": "#!/bin/sh\\n"}'


@pytest.mark.parametrize(("profile", "error"), [
    # what Agama's JSON reader refuses
    ('{"files": [{"destination": "/etc/x", "content": "a\nb"}]}',
     "files[0].content: a raw control character (a line break?) in a string"),
    ('{"files": [{"destination": "/etc/x", "content": "x}]}\n',
     "files[0].content: a string without its closing quote"),
    (agama(files=f"[{FILE},]"), "files[1]: no JSON value at byte"),
    (agama(files='[{"destination": "/etc/x" "content": "x"}]'), "files[0]: ',' or '}' expected"),
    ('{"files": []} {}', "text after the profile's closing }"),
    ('{"files": [], "files": []}', "files: given twice"),
    (agama(files='[{"destination": "/etc/x", "content": "\\ud83d"}]'),
     "files[0].content: a high surrogate without its low one"),
    (agama(files='[{"destination": "/etc/x", "content": "\\x41"}]'),
     "files[0].content: unknown escape \\x"),
    (agama(files='[{"destination": "/etc/x", "content": "\\u00"}]'),
     "files[0].content: \\u needs four hex digits"),
    ("[]", "the profile: a JSON object ({...}) expected"),
    ("", "the profile: a value expected, the text ended"),
    # what Agama's profile schema refuses
    (agama(files='[{"path": "/etc/x", "content": "x"}]'),
     "files[0].path: not in Agama's profile schema"),
    (agama(files='[{"destination": "/etc/x"}]'), "files[0].content: missing (the file's text)"),
    (agama(files='[{"destination": "/etc/x", "content": 1}]'),
     "files[0].content: a string expected, not a number"),
    (agama(files='[{"destination": "/etc/x", "content": "x", "permissions": 384}]'),
     "files[0].permissions: a string expected, not a number"),
    (agama(post='[{"name": "n.sh", "chrooted": false, "content": "#!/bin/sh\\n"}]'),
     "scripts.post[0].chrooted: not in Agama's profile schema"),
    (agama(post='[{"name": "n.sh", "chroot": "false", "content": "#!/bin/sh\\n"}]'),
     "scripts.post[0].chroot: a boolean expected, not a string"),
    (agama(post='[{"name": "n.sh", "chroot": false}]'),
     "scripts.post[0]: one of content (or the deprecated body) expected"),
    (agama(post='[{"name": "n.sh", "content": "#!/bin/sh\\n", "body": "#!/bin/sh\\n"}]'),
     "scripts.post[0]: one of content (or the deprecated body) expected"),
    ('{"scripts": {"post": {}}}', "scripts.post: an array expected, not an object"),
    ('{"scripts": {"final": []}}', "scripts.final: not in Agama's profile schema"),
    # what the lab's installer cannot do
    (agama(files='[{"destination": "etc/x", "content": "x"}]'),
     "files[0].destination 'etc/x': an absolute path to a file"),
    (agama(files='[{"destination": "/etc/../../x", "content": "x"}]'),
     "files[0].destination '/etc/../../x': an absolute path to a file, without .."),
    (agama(files='[{"destination": "/etc/x", "content": "x", "permissions": "rw-r--r--"}]'),
     "files[0].permissions 'rw-r--r--': octal"),
    (agama(files='[{"destination": "/etc/x", "url": "http://h/x"}]'),
     "files[0].url: the lab's installer fetches nothing: put the text in content"),
    (agama(files='[{"destination": "/etc/x", "content": "\\u0000"}]'),
     "files[0].content: \\u0000 (a NUL byte) cannot be written"),
    (agama(post='[{"name": "a/b.sh", "chroot": false, "content": "#!/bin/sh\\n"}]'),
     "scripts.post[0].name 'a/b.sh': a file name"),
    (agama(post='[{"name": "n.sh", "chroot": false, "url": "http://h/n.sh"}]'),
     "scripts.post[0].url: the lab's installer fetches nothing: put the text in content"),
    # Agama runs a script as a program: no #! line, no start
    (agama(post=f'[{SCRIPT}, {{"name": "m.sh", "chroot": false, "body": "echo hi\\n"}}]'),
     "scripts.post[1].body: no #! line: Agama runs the script as a program"),
])
def test_a_profile_agama_or_the_installer_refuses_fails_naming_the_place(
        tmp_path: Path, profile: str, error: str) -> None:
    run, _, _, _ = run_reader("agama.awk", profile, tmp_path)
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert run.stderr.startswith(f"store-installer: profile: {error}"), run.stderr
    assert run.stderr.count("\n") == 1, run.stderr  # one line


def test_a_file_destination_with_a_quote_is_written_where_it_says(tmp_path: Path) -> None:
    """The path goes to mkdir and chmod as one shell word, whatever it holds."""
    dest = "/etc/it's $(touch pwned) `x`/a b.conf"
    profile = json.dumps({"files": [{"destination": dest, "content": "x", "permissions": "600"}]})
    run, files, modes, _ = run_reader("agama.awk", profile, tmp_path)
    assert run.returncode == 0, run.stderr
    assert files == {dest: b"x"} and modes == {dest: 0o600}
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
