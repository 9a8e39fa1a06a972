"""Every spelling of a string contract agrees with store_rollout/contracts.py.

Salt states, reactor, formula defaults, minion.d files, the image's shell scripts and the AutoYaST
profile cannot import Python, so they spell the contracts themselves; this test reads them and
names each file and line that spells one differently (found vs expected). Python code must import
the contract instead of spelling it again.
"""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from store_rollout import contracts as c
from tests.helpers import REPO_ROOT

SALT = Path("salt_states")
IMAGES = Path("image_builds")
# the lab's own descriptions: outside what ships, but their scripts spell the same contracts
LAB_IMAGES = Path("lab/image_builds")
FIRSTBOOT_DIR = SALT / "provisioning_helper" / "firstboot"
HYPERVISOR_DEFAULTS = SALT / "hypervisor" / "parameters" / "defaults.yaml"
STORE_VM_DEFAULTS = SALT / "store_vm" / "parameters" / "defaults.yaml"
MINION_D = IMAGES / "overlays" / "salt-minion" / "etc" / "salt" / c.MINION_CONF_DIR
IDENTITY_SCRIPT = IMAGES / "overlays" / "salt-minion" / "usr" / "local" / "sbin" / "store-identity"
AUTOYAST = IMAGES / "autoyast" / "sles15-xen.xml"

# grains the project's states set
SET_GRAINS = {c.FIRSTBOOT_STAGE_GRAIN, c.HYPERVISOR_READY_GRAIN}
# grains the states may read: the contracts', those the install/image set (role, store_id) and
# Salt's own
READ_GRAINS = {c.FIRSTBOOT_STAGE_GRAIN, c.HYPERVISOR_READY_GRAIN, c.BRIDGE_GRAIN, c.AUTOSIGN_GRAIN,
               c.STORE_PLATFORM_GRAIN, "role", "store_id", "os", "os_family", "osfinger", "ipv4",
               "cpu_flags"}
FIRSTBOOT_TAGS = {c.FIRSTBOOT_EVENT_PREFIX + event for event in c.FIRSTBOOT_EVENTS}
# `store_rollout_*` / `STORE_*` words outside Python: each must be a contract
PROJECT_WORDS = {c.AUTOSIGN_GRAIN, c.HYPERVISOR_READY_GRAIN, c.BRIDGE_GRAIN, c.SEED_LABEL,
                 c.IDENTITY_SEED_DIR_ENV, c.IDENTITY_SALT_DIR_ENV, c.STORE_PLATFORM_GRAIN,
                 c.DATA_DISK_LABEL, c.IDENTITY_DATA_DIR_ENV}
PROJECT_WORD_RE = re.compile(r"\b(store_rollout_[a-z_]+|STORE_[A-Z_]+)\b")
# the hypervisor's own minion config, which its AutoYaST profile writes
HYPERVISOR_MINION_CONF = {"50-store-rollout.conf", c.LIBVIRT_EVENTS_CONF}
MINION_CONF_RE = re.compile(r"\b\d\d-[a-z][a-z0-9-]*\.conf\b")
# values distinctive enough that a Python string equal to one is a second spelling
DISTINCT = {name: getattr(c, name) for name in (
    "AUTOSIGN_GRAIN", "HYPERVISOR_READY_TAG", "HYPERVISOR_READY_GRAIN", "BRIDGE_GRAIN",
    "FIRSTBOOT_SLS", "FIRSTBOOT_STAGE_GRAIN", "FIRSTBOOT_EVENT_PREFIX", "ROLLOUT_PROGRESS_TAG",
    "BOOTSTRAP_CONF", "IDENTITY_CONF", "SEED_LABEL", "SEED_FILE", "IDENTITY_SEED_DIR_ENV",
    "IDENTITY_SALT_DIR_ENV", "LIBVIRT_EVENTS_CONF", "LIBVIRT_EVENTS_ENGINE",
    "LIBVIRT_CONNECTION_LOST", "LIBVIRT_CONNECTION_RESTORED", "DOWNLOAD_CUT",
    "STORE_SERVER_CONFIG", "GO_LIVE_FUNCTION")}
PYTHON_PACKAGES = ("store_rollout", "tasks", "flows", "app", "lab")


class Report:
    """Problems as `file:line: what: found X, expected Y (contracts.NAME)`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.problems: list[str] = []

    def at(self, path: Path, line: int | None, message: str) -> None:
        self.problems.append(f"{path}:{line if line is not None else '-'}: {message}")

    def expect(self, path: Path, line: int | None, what: str, found: Any, expected: Any,
               contract: str) -> None:
        if found != expected:
            self.at(path, line, f"{what}: found {found!r}, expected {expected!r} "
                                f"(store_rollout.contracts.{contract})")

    def expect_in(self, path: Path, line: int | None, what: str, found: Any, allowed: Any,
                  contract: str) -> None:
        if found not in allowed:
            self.at(path, line, f"{what}: found {found!r}, expected one of {sorted(allowed)} "
                                f"(store_rollout.contracts.{contract})")

    def text(self, path: Path) -> str:
        return (self.root / path).read_text()

    def lines(self, path: Path) -> Iterator[tuple[int, str]]:
        return enumerate(self.text(path).splitlines(), start=1)


# -- reading the files ---------------------------------------------------------------------------

def without_jinja(text: str) -> str:
    """YAML of a .sls with its Jinja blanked, line for line ({{ }} becomes a placeholder)."""
    text = re.sub(r"\{%.*?%\}|\{#.*?#\}", "", text)
    return re.sub(r"\{\{.*?\}\}", "JINJA", text)


def sls_arguments(text: str) -> Iterator[tuple[str, str, str, str | None, int]]:
    """(state id, function, argument, scalar value or None, line) of every state argument."""
    root = yaml.compose(without_jinja(text))
    if not isinstance(root, yaml.MappingNode):
        return
    for id_node, body in root.value:
        if not isinstance(body, yaml.MappingNode):
            continue  # include:, extend:
        for fun_node, args in body.value:
            if not isinstance(args, yaml.SequenceNode):
                continue
            for item in args.value:
                if isinstance(item, yaml.MappingNode):
                    for key, value in item.value:
                        scalar = value.value if isinstance(value, yaml.ScalarNode) else None
                        yield id_node.value, fun_node.value, key.value, scalar, key.start_mark.line + 1


def yaml_value(text: str, *keys: str) -> tuple[Any, int | None]:
    """The value under `keys` and its line (None when missing)."""
    node: yaml.Node | None = yaml.compose(text)
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return None, None
        node = next((v for k, v in node.value if k.value == key), None)
    if node is None:
        return None, None
    return yaml.safe_load(yaml.serialize(node)), node.start_mark.line + 1


def engine_line(engine: str, name: str) -> int:
    """The line of a module-level constant in one of the checkout's salt_states/_engines."""
    return python_constants(REPO_ROOT / SALT / "_engines" / f"{engine}.py")[name][1]


def python_constants(path: Path) -> dict[str, tuple[Any, int]]:
    """Module-level NAME = literal assignments of a Python file: value and line."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = (ast.literal_eval(node.value), node.lineno)
            except ValueError:
                continue
    return found


# -- the checks ----------------------------------------------------------------------------------

def check_states(r: Report) -> None:
    """Grains set and read, events sent by every .sls and .jinja of the master's file_roots."""
    for path in sorted((r.root / SALT).rglob("*")):
        if path.suffix not in (".sls", ".jinja"):
            continue
        rel = path.relative_to(r.root)
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), start=1):
            for grain in re.findall(r"grains\.get'?\]?\(\s*['\"]([^'\"]+)['\"]", line):
                r.expect_in(rel, number, "grain read", grain, READ_GRAINS, "*_GRAIN")
        if path.suffix != ".sls":
            continue
        for _state, fun, arg, value, number in sls_arguments(text):
            if value is None or value == "JINJA" or arg != "name":
                continue
            if fun == "grains.present":
                r.expect_in(rel, number, "grain set", value, SET_GRAINS, "*_GRAIN")
            elif fun == "event.send":
                r.expect_in(rel, number, "event tag", value, FIRSTBOOT_TAGS | {c.HYPERVISOR_READY_TAG},
                            "FIRSTBOOT_EVENT_PREFIX + FIRSTBOOT_EVENTS")


def check_firstboot(r: Report) -> None:
    """One sls per stage; init.sls picks it by the stage grain; each stage sets the next."""
    stage_files = sorted(p.stem for p in (r.root / FIRSTBOOT_DIR).glob("*.sls") if p.stem != "init")
    r.expect(FIRSTBOOT_DIR, None, "stage sls files", stage_files, sorted(c.FIRSTBOOT_STAGES),
             "FIRSTBOOT_STAGES")
    init = FIRSTBOOT_DIR / "init.sls"
    picks = [(n, m) for n, line in r.lines(init)
             if (m := re.search(r"firstboot\.\{\{.*grains\.get'\]\(\s*'([^']*)',\s*'([^']*)'", line))]
    if not picks:
        r.at(init, None, "no include of provisioning_helper.firstboot.<stage grain>")
    for number, match in picks:
        r.expect(init, number, "stage grain", match.group(1), c.FIRSTBOOT_STAGE_GRAIN,
                 "FIRSTBOOT_STAGE_GRAIN")
        r.expect(init, number, "stage without the grain", match.group(2), c.FIRSTBOOT_STAGE_NEW,
                 "FIRSTBOOT_STAGE_NEW")
    following = dict(zip(c.FIRSTBOOT_STAGES, c.FIRSTBOOT_STAGES[1:], strict=False))
    sent: set[str] = set()
    for stage in c.FIRSTBOOT_STAGES:
        path = FIRSTBOOT_DIR / f"{stage}.sls"
        if not (r.root / path).exists():
            continue
        states: dict[str, dict[str, tuple[str | None, int]]] = {}
        for state, fun, arg, value, number in sls_arguments(r.text(path)):
            states.setdefault(f"{state} {fun}", {})[arg] = (value, number)
            if fun == "event.send" and arg == "name" and value:
                sent.add(value)
        sets = [(args["value"], args["name"][1]) for key, args in states.items()
                if key.endswith(" grains.present") and args.get("name", (None,))[0]
                == c.FIRSTBOOT_STAGE_GRAIN and "value" in args]
        found = [value for (value, _), _ in sets]
        line = sets[0][0][1] if sets else None
        r.expect(path, line, f"stage {stage!r} sets {c.FIRSTBOOT_STAGE_GRAIN} to",
                 found, [following[stage]] if stage in following else [], "FIRSTBOOT_STAGES")
    r.expect(FIRSTBOOT_DIR, None, "firstboot events sent", sorted(sent), sorted(FIRSTBOOT_TAGS),
             "FIRSTBOOT_EVENT_PREFIX + FIRSTBOOT_EVENTS")


def check_hypervisor_ready(r: Report) -> None:
    text = r.text(HYPERVISOR_DEFAULTS)
    for key, contract in (("tag", "HYPERVISOR_READY_TAG"), ("grain", "HYPERVISOR_READY_GRAIN")):
        value, line = yaml_value(text, "values", "ready", key)
        r.expect(HYPERVISOR_DEFAULTS, line, f"values.ready.{key}", value, getattr(c, contract), contract)
    # the TLS listener's DN list: the store's own boxes (a refresh's migration, issue 48)
    value, line = yaml_value(text, "values", "libvirt", "tls_allowed_dns")
    r.expect(HYPERVISOR_DEFAULTS, line, "values.libvirt.tls_allowed_dns", value,
             list(c.LIBVIRT_TLS_ALLOWED_DNS), "LIBVIRT_TLS_ALLOWED_DNS")
    ready = SALT / "hypervisor" / "ready" / "init.sls"
    for needed in ("{{ hv.ready.grain }}", "{{ hv.ready.tag }}"):
        if needed not in r.text(ready):
            r.at(ready, None, f"spells the ready contract itself: use {needed} (defaults.yaml)")


def check_hypervisor_events(r: Report) -> None:
    """The libvirt_events engine's minion.d file and tag prefix: formula defaults, AutoYaST
    profile and the master's forwarding engine."""
    text = r.text(HYPERVISOR_DEFAULTS)
    for key, contract in (("conf", "LIBVIRT_EVENTS_CONF"), ("tag_prefix", "LIBVIRT_EVENT_TAG_PREFIX")):
        value, line = yaml_value(text, "values", "events", key)
        r.expect(HYPERVISOR_DEFAULTS, line, f"values.events.{key}", value, getattr(c, contract),
                 contract)
    paths = [(n, m.group(1)) for n, line in r.lines(AUTOYAST)
             if (m := re.search(r"<file_path>/etc/salt/minion\.d/(6\d-[^<]+)</file_path>", line))]
    r.expect(AUTOYAST, paths[0][0] if paths else None, "engine minion.d file",
             [name for _, name in paths], [c.LIBVIRT_EVENTS_CONF], "LIBVIRT_EVENTS_CONF")
    for number, line in r.lines(AUTOYAST):
        if m := re.match(r"\s+tag_prefix: (\S+)", line):
            r.expect(AUTOYAST, number, "engine tag_prefix", m.group(1), c.LIBVIRT_EVENT_TAG_PREFIX,
                     "LIBVIRT_EVENT_TAG_PREFIX")
    engine = SALT / "_engines" / "store_prefect_events.py"
    value, line = python_constants(r.root / engine).get("LIBVIRT_EVENT_PREFIX", (None, None))
    r.expect(engine, line, "LIBVIRT_EVENT_PREFIX", value, c.LIBVIRT_EVENT_TAG_PREFIX,
             "LIBVIRT_EVENT_TAG_PREFIX")
    connection = (c.LIBVIRT_CONNECTION_LOST, c.LIBVIRT_CONNECTION_RESTORED)
    value, line = python_constants(r.root / engine).get("LIBVIRT_CONNECTION_EVENTS", (None, None))
    r.expect(engine, line, "LIBVIRT_CONNECTION_EVENTS", value, connection,
             "LIBVIRT_CONNECTION_LOST / _RESTORED")
    value, line = python_constants(r.root / engine).get("SIGNATURE_FIELD", (None, None))
    r.expect(engine, line, "SIGNATURE_FIELD", value, c.STORE_EVENT_SIGNATURE,
             "STORE_EVENT_SIGNATURE")
    check_libvirt_events_engine(r)


def check_libvirt_events_engine(r: Report) -> None:
    """The hypervisor's engine by name: its module in _engines, the formula's and the profile's
    minion.d file run it, the profile writes the module from the snippet of that name into the
    minion's extension modules; its own event suffixes."""
    name = c.LIBVIRT_EVENTS_ENGINE
    module = SALT / "_engines" / f"{name}.py"
    if not (r.root / module).exists():
        r.at(module, None, "missing: the engine the minion.d file runs (LIBVIRT_EVENTS_ENGINE)")
    else:
        constants = python_constants(r.root / module)
        for constant, contract in (("CONNECTION_LOST", "LIBVIRT_CONNECTION_LOST"),
                                   ("CONNECTION_RESTORED", "LIBVIRT_CONNECTION_RESTORED"),
                                   ("SIGNATURE_FIELD", "STORE_EVENT_SIGNATURE")):
            value, line = constants.get(constant, (None, None))
            r.expect(module, line, constant, value, getattr(c, contract), contract)
    value, line = yaml_value(r.text(HYPERVISOR_DEFAULTS), "values", "events", "engine")
    r.expect(HYPERVISOR_DEFAULTS, line, "values.events.engine", value, name,
             "LIBVIRT_EVENTS_ENGINE")
    events_sls = SALT / "hypervisor" / "events" / "init.sls"
    if "- {{ hv.events.engine }}:" not in r.text(events_sls):
        r.at(events_sls, None, "spells the engine itself: use {{ hv.events.engine }} (defaults.yaml)")
    extmods = "/var/cache/salt/minion/extmods/engines/"
    found: dict[str, tuple[int, str]] = {}
    previous = ""
    for number, line_text in r.lines(AUTOYAST):
        if previous.endswith("engines:") and (m := re.match(r"\s+- (\w+):$", line_text)):
            found["engine"] = (number, m.group(1))
        previous = line_text
        if m := re.search(rf"<file_path>{extmods}([^<]+)</file_path>", line_text):
            found["module"] = (number, m.group(1))
        if m := re.search(r"\$SNIPPET\('([^']+)'\)", line_text):
            found["snippet"] = (number, m.group(1))
    for key, expected in (("engine", name), ("module", f"{name}.py"), ("snippet", f"{name}.py")):
        number, value = found.get(key, (None, None))
        r.expect(AUTOYAST, number, f"engine {key}", value, expected, "LIBVIRT_EVENTS_ENGINE")


def check_store_server_config(r: Report) -> None:
    """The role's config file the formula writes, firstboot's verify stage requires and the
    go-live gate reads; the gate's module and function."""
    values = (yaml.safe_load(r.text(STORE_VM_DEFAULTS)) or {}).get("values", {})
    r.expect(STORE_VM_DEFAULTS, None, "config_dir/config_file",
             f"{values.get('config_dir')}/{values.get('config_file')}", c.STORE_SERVER_CONFIG,
             "STORE_SERVER_CONFIG")
    # the data disk the formula requires mounted and the go-live gate checks
    text = r.text(STORE_VM_DEFAULTS)
    for keys, contract in ((("data_disk", "mount"), "DATA_DISK_MOUNT"),
                           (("data_disk", "label"), "DATA_DISK_LABEL"),
                           (("go_live", "data_disk", "path"), "DATA_DISK_MOUNT"),
                           (("go_live", "data_disk", "label"), "DATA_DISK_LABEL")):
        value, line = yaml_value(text, "values", *keys)
        r.expect(STORE_VM_DEFAULTS, line, "values." + ".".join(keys), value,
                 getattr(c, contract), contract)
    verify = FIRSTBOOT_DIR / "verify.sls"
    paths = [(n, m.group(1)) for n, line in r.lines(verify)
             if (m := re.search(r"provisioning\.root_path'\]\('([^']+)'\)", line))]
    r.expect(verify, paths[0][0] if paths else None, "required config file",
             [path for _, path in paths], [c.STORE_SERVER_CONFIG], "STORE_SERVER_CONFIG")
    module, function = c.GO_LIVE_FUNCTION.split(".")
    gate = SALT / "_modules" / f"{module}.py"
    if not (r.root / gate).exists():
        r.at(gate, None, f"missing: the go-live gate calls {c.GO_LIVE_FUNCTION}")
    elif not re.search(rf"^def {function}\(", r.text(gate), re.MULTILINE):
        r.at(gate, None, f"no function {function}: the go-live gate calls {c.GO_LIVE_FUNCTION}")


def check_reactor(r: Report) -> None:
    reactor = SALT / "reactor" / "reactor.yaml"
    tags = yaml.safe_load(r.text(reactor)) or {}
    store_tags = [tag for tag in tags if tag.startswith("store/")]
    r.expect(reactor, None, "store/ reactor tags", store_tags, [c.FIRSTBOOT_EVENT_PREFIX + "*"],
             "FIRSTBOOT_EVENT_PREFIX")
    progress = SALT / "reactor" / "firstboot_progress.sls"
    for number, line in r.lines(progress):
        if m := re.match(r"\s*- tag: (\S+)", line):
            r.expect(progress, number, "re-announced tag", m.group(1), c.ROLLOUT_PROGRESS_TAG,
                     "ROLLOUT_PROGRESS_TAG")
    # the only tags it reacts to (a minion writes the tag, and the glob above matches anything)
    spelled = {m.group(1): (m.group(2), number) for number, line in r.lines(progress)
               if (m := re.match(r"\{%-? set (firstboot_prefix|firstboot_events) = (.*?) -?%\}", line))}
    for name, expected, contract in (("firstboot_prefix", c.FIRSTBOOT_EVENT_PREFIX, "FIRSTBOOT_EVENT_PREFIX"),
                                     ("firstboot_events", list(c.FIRSTBOOT_EVENTS), "FIRSTBOOT_EVENTS")):
        value, number = spelled.get(name, (None, None))
        r.expect(progress, number, name, None if value is None else yaml.safe_load(value),
                 expected, contract)


def check_salt_modules(r: Report) -> None:
    for kind, module, names in (
            ("_modules", "provisioning", ("BOOTSTRAP_FILES",)),
            ("_modules", "storevirt", ("SYNCED_EXTENSION_PATTERN",)),
            ("_modules", "storedata", ("DATA_DISK_FILE",)),
            ("_utils", "store_seed_iso",
             ("SEED_LABEL", "SEED_FILE", "SEED_KEYS", "SEED_METADATA_NS")),
            ("_engines", "store_autosign_guard",
             ("AUTOSIGN_GRAIN", "TOKEN_MAP_FILE", "AUTOSIGN_REFUSED_TAG",
              "AUTOSIGN_FORGED_TAG"))):
        path = SALT / kind / f"{module}.py"
        constants = python_constants(r.root / path)
        for name in names:
            value, line = constants.get(name, (None, None))
            r.expect(path, line, name, value, getattr(c, name), name)
    # the hypervisor's image download: in storevirt or the helpers it imports from _utils
    candidates = [SALT / "_modules" / "storevirt.py",
                  *sorted(p.relative_to(r.root) for p in (r.root / SALT / "_utils").glob("*.py"))]
    found = [(path, *python_constants(r.root / path)["DOWNLOAD_CUT"]) for path in candidates
             if "DOWNLOAD_CUT" in python_constants(r.root / path)]
    if not found:
        r.at(candidates[0], None, "no DOWNLOAD_CUT (store_rollout.contracts.DOWNLOAD_CUT)")
    for path, value, line in found:
        r.expect(path, line, "DOWNLOAD_CUT", value, c.DOWNLOAD_CUT, "DOWNLOAD_CUT")


def check_minion_d(r: Report) -> None:
    files = sorted(p.name for p in (r.root / MINION_D).iterdir())
    if c.BOOTSTRAP_CONF not in files:
        r.at(MINION_D, None, f"no {c.BOOTSTRAP_CONF} (store_rollout.contracts.BOOTSTRAP_CONF) "
                             f"among {files}")
    else:
        text = r.text(MINION_D / c.BOOTSTRAP_CONF)
        value, line = yaml_value(text, "sls_list")
        r.expect(MINION_D / c.BOOTSTRAP_CONF, line, "sls_list", value, [c.FIRSTBOOT_SLS],
                 "FIRSTBOOT_SLS")
    if c.IDENTITY_CONF in files:
        r.at(MINION_D / c.IDENTITY_CONF, None, "written at boot by store-identity, not shipped")
    for path in sorted((r.root / MINION_D).glob("*.conf")):
        value, line = yaml_value(path.read_text(), "autosign_grains")
        if value is not None:
            r.expect(path.relative_to(r.root), line, "autosign_grains", value, [c.AUTOSIGN_GRAIN],
                     "AUTOSIGN_GRAIN")


def check_identity_script(r: Report) -> None:
    path = IDENTITY_SCRIPT
    keys: list[str] = []
    written: list[tuple[int, str]] = []
    for number, line in r.lines(path):
        for var, contract in (("SEED_LABEL", "SEED_LABEL"), ("SEED_FILE", "SEED_FILE")):
            if m := re.match(rf"{var}=(\S+)", line):
                r.expect(path, number, var, m.group(1), getattr(c, contract), contract)
        if m := re.match(r"\s+([a-z_]+)\) [a-z_]+=\$value ;;", line):
            keys.append(m.group(1))
        if m := re.match(r'\s*grains="\s+([^:]+):', line):
            r.expect(path, number, "token grain", m.group(1), c.AUTOSIGN_GRAIN, "AUTOSIGN_GRAIN")
        if m := re.search(r'write_file "\$SALT_DIR/minion\.d/([^"]+)"', line):
            written.append((number, m.group(1)))
        for env in re.findall(r"\$\{(STORE_IDENTITY_[A-Z_]+):-", line):
            r.expect_in(path, number, "environment variable", env,
                        {c.IDENTITY_SEED_DIR_ENV, c.IDENTITY_SALT_DIR_ENV,
                         c.IDENTITY_DATA_DIR_ENV}, "IDENTITY_*_ENV")
    r.expect(path, None, "seed keys read", sorted(keys), sorted(c.SEED_KEYS), "SEED_KEYS")
    r.expect(path, written[0][0] if written else None, "minion.d file written",
             [name for _, name in written], [c.IDENTITY_CONF], "IDENTITY_CONF")
    scripts = [p for top in (IMAGES, LAB_IMAGES) for p in sorted((r.root / top).glob("*/config.sh"))]
    for config_sh in scripts:
        if f"minion.d/{c.IDENTITY_CONF}" not in config_sh.read_text():
            r.at(config_sh.relative_to(r.root), None,
                 f"does not remove a stray minion.d/{c.IDENTITY_CONF} (contracts.IDENTITY_CONF)")


def check_autoyast(r: Report) -> None:
    """The profile's default autosign grain; the platform grain it writes from the record's
    platform meta; the registration meta it reads."""
    platform_grains = []
    for number, line in r.lines(AUTOYAST):
        if m := re.search(r"getVar\('autosign_grain', '([^']*)'\)", line):
            r.expect(AUTOYAST, number, "default autosign grain", m.group(1), c.AUTOSIGN_GRAIN,
                     "AUTOSIGN_GRAIN")
        m = re.match(r"\s+(\w+): '\$getVar\('(\w+)', '[^']*'\)'$", line)
        if m and {c.STORE_PLATFORM_META, c.STORE_PLATFORM_GRAIN} & set(m.groups()):
            platform_grains.append((number, m.group(1), m.group(2)))
    number = platform_grains[0][0] if platform_grains else None
    r.expect(AUTOYAST, number, "platform grain: meta", [(grain, meta) for _, grain, meta in platform_grains],
             [(c.STORE_PLATFORM_GRAIN, c.STORE_PLATFORM_META)],
             "STORE_PLATFORM_GRAIN / STORE_PLATFORM_META")
    text = r.text(AUTOYAST)
    for contract in ("REGISTRATION_URL_META", "REGISTRATION_CODE_META"):
        if f"$getVar('{getattr(c, contract)}', '')" not in text:
            r.at(AUTOYAST, None, f"does not read the {getattr(c, contract)!r} meta "
                                 f"(store_rollout.contracts.{contract})")


def check_words(r: Report) -> None:
    """Outside Python, every project word and minion.d file name is a known one (typos)."""
    known = {p.name for p in (r.root / MINION_D).iterdir()} | {c.IDENTITY_CONF} | HYPERVISOR_MINION_CONF
    for top in (SALT, IMAGES, LAB_IMAGES):
        for path in sorted((r.root / top).rglob("*")):
            if not path.is_file() or path.suffix in (".py", ".pyc"):
                continue
            rel = path.relative_to(r.root)
            for number, line in r.lines(rel):
                for word in PROJECT_WORD_RE.findall(line):
                    r.expect_in(rel, number, "project word", word, PROJECT_WORDS, "*")
                for name in MINION_CONF_RE.findall(line):
                    r.expect_in(rel, number, "minion.d file", name, known, "BOOTSTRAP_FILES")


def check_python(r: Report) -> None:
    """Python imports the contracts: no second spelling, the flow runs the steps in order."""
    by_value = {value: name for name, value in DISTINCT.items()}
    for package in PYTHON_PACKAGES:
        for path in sorted((r.root / package).rglob("*.py")):
            rel = path.relative_to(r.root)
            if rel == Path("store_rollout/contracts.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in by_value:
                    r.at(rel, node.lineno, f"spells {node.value!r} again: import "
                                           f"store_rollout.contracts.{by_value[node.value]}")
    flow = Path("flows/rollout.py")
    steps = []
    for node in ast.walk(ast.parse(r.text(flow))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "run" and node.args:
            first = node.args[0]
            steps.append((node.lineno, getattr(c, first.id, first.id) if isinstance(first, ast.Name)
                          else ast.unparse(first)))
    steps.sort()  # in source order (ast.walk reaches a call inside a lambda later)
    r.expect(flow, steps[0][0] if steps else None, "steps the flow runs",
             tuple(step for _, step in steps), c.STEPS, "STEPS")


CHECKS = (check_states, check_firstboot, check_hypervisor_ready, check_hypervisor_events,
          check_store_server_config, check_reactor, check_salt_modules, check_minion_d,
          check_identity_script, check_autoyast, check_words)


def problems(root: Path, checks: tuple[Any, ...] = CHECKS) -> list[str]:
    report = Report(root)
    for check in checks:
        check(report)
    return report.problems


@pytest.mark.parametrize("check", [*CHECKS, check_python], ids=lambda f: f.__name__)
def test_every_spelling_agrees_with_the_contracts(check: Any) -> None:
    found = problems(REPO_ROOT, (check,))
    assert not found, "spelled differently from store_rollout/contracts.py:\n" + "\n".join(found)


def test_the_checks_find_planted_violations(tmp_path: Path) -> None:
    for top in (SALT, IMAGES, LAB_IMAGES):
        # symlinks kept: the lab's root -> ../../../image_builds/overlays/... is the copy's overlay
        shutil.copytree(REPO_ROOT / top, tmp_path / top, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))

    def plant(path: Path, old: str, new: str) -> None:
        text = (tmp_path / path).read_text()
        assert old in text, (path, old)
        (tmp_path / path).write_text(text.replace(old, new, 1))

    plant(FIRSTBOOT_DIR / "verify.sls", "- name: firstboot_stage", "- name: firstboot_stag")
    plant(FIRSTBOOT_DIR / "highstate.sls", "- value: verify", "- value: verified")
    plant(FIRSTBOOT_DIR / "new.sls", "store/vm/firstboot/started", "store/vm/firstbot/started")
    plant(HYPERVISOR_DEFAULTS, "grain: store_rollout_hypervisor_ready", "grain: hv_ready")
    plant(STORE_VM_DEFAULTS, "config_file: store.yaml", "config_file: store.yml")
    plant(MINION_D / "20-autosign.conf", "- store_rollout_token", "- store_rollout_tokens")
    plant(IDENTITY_SCRIPT, "SEED_LABEL=STORE_SEED", "SEED_LABEL=STORE-SEED")
    plant(SALT / "_modules" / "provisioning.py", '"15-identity.conf"', '"16-identity.conf"')
    plant(IMAGES / "leap16-jeos" / "config.sh", "15-identity.conf", "15-identty.conf")
    plant(LAB_IMAGES / "lab-debian" / "config.sh", "15-identity.conf", "15-identiy.conf")
    plant(AUTOYAST, "tag_prefix: store/libvirt", "tag_prefix: store/libvirt_events")
    plant(AUTOYAST, "  - store_libvirt_events:", "  - libvirt_events:")
    plant(AUTOYAST, "store_rollout_platform: '$getVar('store_platform'",
          "store_rollout_platfrom: '$getVar('store_platform'")
    plant(SALT / "_engines" / "store_libvirt_events.py", 'CONNECTION_LOST = "connection/lost"',
          'CONNECTION_LOST = "connection/gone"')
    plant(SALT / "_engines" / "store_autosign_guard.py",
          'TOKEN_MAP_FILE = "store_rollout_tokens.json"', 'TOKEN_MAP_FILE = "tokens.json"')
    plant(SALT / "_engines" / "store_prefect_events.py", 'LIBVIRT_EVENT_PREFIX = "store/libvirt"',
          'LIBVIRT_EVENT_PREFIX = "salt/engines/libvirt_events"')
    cut_at = next(path.relative_to(tmp_path) for path in [
        tmp_path / SALT / "_modules" / "storevirt.py", *sorted((tmp_path / SALT / "_utils").glob("*.py"))]
        if 'DOWNLOAD_CUT = "download cut"' in path.read_text())
    plant(cut_at, 'DOWNLOAD_CUT = "download cut"', 'DOWNLOAD_CUT = "download stopped"')
    found = "\n".join(problems(tmp_path))
    _, ready_line = yaml_value((REPO_ROOT / HYPERVISOR_DEFAULTS).read_text(), "values", "ready",
                               "grain")
    for expected in (
        "provisioning_helper/firstboot/verify.sls:14: grain set: found 'firstboot_stag'",
        "provisioning_helper/firstboot/highstate.sls:17: stage 'highstate' sets firstboot_stage "
        "to: found ['verified'], expected ['verify']",
        "provisioning_helper/firstboot/new.sls:11: event tag: found 'store/vm/firstbot/started'",
        f"defaults.yaml:{ready_line}: values.ready.grain: found 'hv_ready'",
        "store_vm/parameters/defaults.yaml:-: config_dir/config_file: found "
        "'etc/store-server/store.yml'",
        "20-autosign.conf:4: autosign_grains: found ['store_rollout_tokens']",
        "store-identity:21: SEED_LABEL: found 'STORE-SEED', expected 'STORE_SEED'",
        "provisioning.py:16: BOOTSTRAP_FILES: found ('90-bootstrap.conf', '16-identity.conf')",
        "leap16-jeos/config.sh:25: minion.d file: found '15-identty.conf'",
        "lab-debian/config.sh:14: minion.d file: found '15-identiy.conf'",
        "lab-debian/config.sh:-: does not remove a stray minion.d/15-identity.conf",
        "sles15-xen.xml:319: engine tag_prefix: found 'store/libvirt_events'",
        "sles15-xen.xml:317: engine engine: found 'libvirt_events'",
        "sles15-xen.xml:284: platform grain: meta: found [('store_rollout_platfrom', "
        "'store_platform')]",
        "sles15-xen.xml:284: project word: found 'store_rollout_platfrom'",
        # the engines' lines as they stand (they change more often than the files above)
        f"store_libvirt_events.py:{engine_line('store_libvirt_events', 'CONNECTION_LOST')}: "
        "CONNECTION_LOST: found 'connection/gone'",
        f"store_prefect_events.py:{engine_line('store_prefect_events', 'LIBVIRT_EVENT_PREFIX')}: "
        "LIBVIRT_EVENT_PREFIX: found 'salt/engines/libvirt_events'",
        f"store_autosign_guard.py:{engine_line('store_autosign_guard', 'TOKEN_MAP_FILE')}: "
        "TOKEN_MAP_FILE: found 'tokens.json'",
        "DOWNLOAD_CUT: found 'download stopped', expected 'download cut'",
    ):
        assert expected in found, f"{expected!r} not reported; reported:\n{found}"
