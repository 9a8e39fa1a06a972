"""Checks run before any side effect: every problem found, with the field and the fix."""

from __future__ import annotations

import json
import os
import socket
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from store_rollout.image_versions import ImageVersionError, build_of, store_version
from store_rollout.inventory import Store
from store_rollout.platforms import PLATFORMS, PlatformError, host_platform
from store_rollout.regions import RegionsError, wrong_region
from store_rollout.settings import RolloutSettings
from store_rollout.settings_parts import (
    BmcSettings,
    CobblerSettings,
    ErpSettings,
    HostSettings,
    ImageSettings,
)
from tasks.bmc import bmc_problems
from tasks.cobbler import CobblerClient, CobblerError, cobbler_client
from tasks.erp import ErpClient, erp_client
from tasks.kiwi import KiwiDescriptionError, resolve_description
from tasks.salt import master_client
from tasks.slots import limit_problem


class PreflightError(ValueError):
    """The rollout cannot start: settings, inventory and outside systems disagree."""


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _root_passwords(rendered: str) -> list[str]:
    """Root's password(s) in a rendered profile: AutoYaST XML (`users/user` root's
    `user_password`) or Agama JSON (`root.password`); ValueError when it is neither."""
    if rendered.lstrip().startswith("{"):
        profile = json.loads(rendered)
        root = profile.get("root") if isinstance(profile, dict) else None
        return [str(root.get("password") or "")] if isinstance(root, dict) else []
    try:
        doc = ET.fromstring(rendered.lstrip())
    except ET.ParseError as exc:
        raise ValueError(f"renders no XML or JSON ({exc})") from None
    found = []
    for user in doc.iter():
        fields = {_local(c.tag): (c.text or "").strip() for c in user}
        if _local(user.tag) == "user" and fields.get("username") == "root":
            found.append(fields.get("user_password", ""))
    return found


def root_password_problem(client: CobblerClient, profile: str) -> str | None:
    """What is wrong with root's password in a Cobbler profile, rendered as for a system that
    has no `root_password_hash` (the profile alone): Cobbler's own default_password_crypted (the
    well-known hash of "cobbler") anywhere in it, or root given any password but a locked one
    ("!"/"*"), which every such host would share. None when root is locked there."""
    rendered = client.render_profile_autoinstall(profile)
    default = str(client.settings().get("default_password_crypted") or "")
    templates = " or ".join(f"image_builds/{p.template}" for p in PLATFORMS.values())
    fix = (f"use {templates} (its platform's) as its autoinstall template (root locked without "
           "the per-store root_password_hash step 2 sets)")
    if default and default in rendered:
        return (f"Cobbler profile {profile!r}: its autoinstall template falls back to Cobbler's "
                f"default_password_crypted (every store's root password would be Cobbler's "
                f"default); {fix}")
    try:
        passwords = _root_passwords(rendered)
    except ValueError as exc:
        return f"Cobbler profile {profile!r}: its autoinstall template {exc}; {fix}"
    for password in passwords:
        if not password:
            return (f"Cobbler profile {profile!r}: its autoinstall template leaves root's password "
                    f"empty; {fix}")
        if not password.startswith(("!", "*")):
            return (f"Cobbler profile {profile!r}: its autoinstall template gives root a password "
                    f"of its own, not the store's (every store would share it); {fix}")
    return None


UNIT_MIB = {"M": 1, "G": 1024, "T": 1024 * 1024}


def declared_disk_mib(desc_dir: Path) -> int:
    """Largest `<size>` any build type of the description declares (0 when none)."""
    root = ET.parse(desc_dir / "config.xml").getroot()
    sizes = [int(float(el.text or 0) * UNIT_MIB.get(el.get("unit", "M"), 1))
             for el in root.iterfind("./preferences/type/size")]
    return max(sizes, default=0)


def _reachable(url: str, what: str, field: str) -> str | None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"{field}: {url!r} is not an http(s) URL ({what})"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=3):
            return None
    except OSError as exc:
        return f"{field}: {what} at {url} unreachable ({exc.strerror or exc}); check the URL"


def autosign_guard_problem(master_opts: dict[str, Any]) -> str | None:
    """Without its guard, a one-time token read from an install profile signs in any minion id
    (Salt compares the grain value only): the master must run the store_autosign_guard engine
    and put the autosign grains into its salt/auth accept events."""
    engines = [next(iter(e)) if isinstance(e, dict) else str(e)
               for e in master_opts.get("engines") or []]
    missing = []
    if "store_autosign_guard" not in engines:
        missing.append("engines: [store_autosign_guard] (engines_dirs: [<file_roots>/_engines])")
    if "accept" not in (master_opts.get("auth_events_autosign_grains") or []):
        missing.append("auth_events_autosign_grains: [accept]")
    if master_opts.get("auth_events") is False:
        missing.append("auth_events: True")
    if not missing:
        return None
    return ("the master does not guard its one-time autosign tokens (any minion id could sign "
            f"in with a token read from an install profile): add {'; '.join(missing)} and "
            "restart it (docs/production.md, item 6)")


def master_problem(settings: RolloutSettings, opts: dict[str, Any]) -> str | None:
    """The master of this worker's region must answer on its ret port (the worker runs on the
    master's host): a stopped master fails the rollout here, naming it, not in step 2 after
    the host was wiped."""
    host = str(opts.get("interface") or "127.0.0.1")
    address = ("127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host,
               int(opts.get("ret_port") or 4506))
    try:
        with socket.create_connection(address, timeout=3):
            return None
    except OSError as exc:
        return (f"salt_master_config: the Salt master of region {settings.region!r} "
                f"({settings.salt_master_config}, id {opts.get('id')!r}) does not answer at "
                f"{address[0]}:{address[1]} ({exc.strerror or exc}): start it, then run again")


def region_problems(stores: list[Store], settings: RolloutSettings) -> list[str]:
    try:
        regions = settings.regions()
    except RegionsError as exc:
        return [str(exc)]
    found = [wrong_region(s.store_id, s.region, settings.region, regions) for s in stores]
    return [problem for problem in found if problem]


def check_region(store: Store, settings: RolloutSettings) -> None:
    """A run without preflight (rollback, decommission) refuses a store of another region
    before it touches anything: this worker's master knows nothing of it, so its undo would
    find nothing to undo and report success."""
    problems = region_problems([store], settings)
    if problems:
        raise PreflightError("; ".join(problems))


def store_profiles(stores: list[Store], hosts: HostSettings, problems: list[str]) -> dict[str, str]:
    """Each store's Cobbler profile (its own, else its platform's); a store whose platform is
    missing or cannot work with the settings goes to `problems` instead."""
    profiles = {}
    for store in stores:
        try:
            platform = host_platform(store, hosts)
        except PlatformError as exc:
            problems.append(str(exc))
            continue
        profiles[store.store_id] = platform.profile_of(store)
    return profiles


def image_problems(stores: list[Store], images: ImageSettings) -> list[str]:
    """Each store's image version listed, its description there, the VM's disk big enough."""
    problems: list[str] = []
    for store in stores:
        try:
            description, _params = build_of(images, store_version(images, store.vm.image_version))
        except ImageVersionError as exc:
            problems.append(f"store {store.store_id!r}: {exc}")
            continue
        try:
            image_mib = declared_disk_mib(resolve_description(description))
        except KiwiDescriptionError:
            problems.append(f"store {store.store_id!r}: image_description: no image description "
                            f"{description!r} under image_builds/ (set "
                            "STORE_ROLLOUT_IMAGE_DESCRIPTION, or the version's description)")
            continue
        if store.vm.disk_gib * 1024 < image_mib:
            problems.append(
                f"store {store.store_id!r}: vm.disk_gib: {store.vm.disk_gib} GiB is smaller "
                f"than the image ({image_mib} MiB); use at least {-(-image_mib // 1024)}")
    return list(dict.fromkeys(problems))


def preflight(stores: list[Store], settings: RolloutSettings) -> None:
    """Raise PreflightError listing every problem; touches nothing."""
    problems: list[str] = region_problems(stores, settings)
    profiles = store_profiles(stores, HostSettings.of(settings), problems)
    problems.extend(image_problems(stores, ImageSettings.of(settings)))
    problems.extend(bmc_problems(stores, BmcSettings.of(settings)))
    if not os.path.isfile(settings.salt_master_config):
        problems.append(f"salt_master_config: {settings.salt_master_config} is not a file "
                        "(set STORE_ROLLOUT_SALT_MASTER_CONFIG)")
    else:
        opts = master_client(settings.salt_master_config).opts
        guard = autosign_guard_problem(opts)
        if guard:
            problems.append(f"salt_master_config: {settings.salt_master_config}: {guard}")
        down = master_problem(settings, opts)
        if down:
            problems.append(down)
    client: CobblerClient | None = None
    erp: ErpClient | None = None
    # the URLs and logins the tasks will use (a Block, or the settings and a Secret block)
    try:
        client = cobbler_client(CobblerSettings.of(settings))
    except (CobblerError, ValueError) as exc:  # a Block missing, a URL refused
        problems.append(f"cobbler: {exc}")
    try:
        erp = erp_client(ErpSettings.of(settings))
    except ValueError as exc:
        problems.append(f"erp: {exc}")
    for url, what, field in ((client.url if client else None, "Cobbler", "cobbler_url"),
                             (erp.base_url if erp else None, "the ERP", "erp_url")):
        problem = _reachable(url, what, field) if url is not None else None
        if problem:
            problems.append(problem)
    if client is not None and not any("cobbler_url" in p for p in problems):
        try:
            client.token()  # credentials work
            for profile in sorted(set(profiles.values())):
                users = [store_id for store_id, p in profiles.items() if p == profile]
                if not client.profile_exists(profile):
                    problems.append(f"store(s) {users}: hypervisor.cobbler_profile: Cobbler has "
                                    f"no profile {profile!r}; create it or fix the inventory")
                    continue
                root_problem = root_password_problem(client, profile)
                if root_problem:
                    problems.append(f"store(s) {users}: {root_problem}")
        except CobblerError as exc:
            problems.append(f"cobbler: {exc}")
    slot = limit_problem(settings.cobbler_sync_limit, 1)
    if slot:
        problems.append(slot)
    if problems:
        raise PreflightError("preflight failed: " + "; ".join(problems))
