"""Each hypervisor's root password is its store's own: made on the first install and kept in a
Prefect Secret block, reused by a rerun, passed to Cobbler as a SHA-512 crypt(3) hash that is
never shown by a plan nor in a repr or a log; and the profile's update repositories from the
settings (no lab; the render in a real Cobbler is tests/lab/test_lab_cobbler.py)."""

from __future__ import annotations

import logging
import uuid
import warnings
from typing import Any

import pytest
from passlib.hash import sha512_crypt
from prefect.blocks.system import Secret
from pydantic import SecretStr

from store_rollout.contracts import ROOT_PASSWORD_HASH_META, UPDATE_REPOS_META
from store_rollout.inventory import Store, parse_inventory
from store_rollout.settings import load_settings
from store_rollout.update_repos import LEAP16_UPDATE_REPOS, update_repos_meta
from tasks.cobbler import system_changes, system_spec
from tasks.root_password import (
    ROOT_PASSWORD_ALPHABET,
    ROOT_PASSWORD_LENGTH,
    root_password_block_name,
    root_password_hash,
    store_root_password,
)
from tests.helpers import BASE_ENV, spec_parts

# Cobbler's default_password_crypted: the hash of "cobbler" (store-stack.md)
COBBLER_DEFAULT_HASH = "$1$mF86/UHC$WvcIcX2t6crBz2onWxyac."


def glibc_crypt(password: str, salt: str) -> str | None:
    """crypt(3) of the C library, as a store host's PAM checks a password (stdlib `crypt`, in
    Python up to 3.12); None where there is none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import crypt
        except ImportError:
            return None
    return crypt.crypt(password, salt)


def store(store_id: str = "0042") -> Store:
    return parse_inventory({"stores": [{
        "store_id": store_id,
        "hypervisor": {"hostname": f"hv-{store_id}.invalid", "mac": "52:54:00:42:00:01"},
        "vm": {"vcpus": 1, "memory_mib": 256, "disk_gib": 2, "network": "none"},
        "erp": {"site_code": "DE-0042"}}]}).stores[0]


def new_store_id() -> str:
    return f"t{uuid.uuid4().hex[:8]}"  # Secret blocks live as long as the test session's server


def test_each_store_gets_its_own_password_kept_in_a_secret_block(
        prefect_harness: None, caplog: pytest.LogCaptureFixture) -> None:
    first, second = new_store_id(), new_store_id()
    with caplog.at_level(logging.DEBUG):
        password = store_root_password(first)
        again = store_root_password(first)  # a rerun
        other = store_root_password(second)
    value = password.get_secret_value()
    assert again.get_secret_value() == value  # kept, not made anew
    assert other.get_secret_value() != value  # never the same for two stores
    assert len(value) == ROOT_PASSWORD_LENGTH and set(value) <= set(ROOT_PASSWORD_ALPHABET)
    # where an operator reads it (the UI's Blocks page): the store's Secret block
    block: Any = Secret.load(root_password_block_name(first))
    assert root_password_block_name(first) == f"store-{first}-root-password"
    assert block.value.get_secret_value() == value
    assert value not in repr(password) and value not in str(block)
    assert value not in caplog.text and other.get_secret_value() not in caplog.text


def test_a_password_the_operator_set_is_used(prefect_harness: None) -> None:
    sid = new_store_id()
    # digits only: Secret.get() would hand back the number 4711, the block's text is the password
    Secret(value="4711").save(root_password_block_name(sid))
    assert store_root_password(sid).get_secret_value() == "4711"


@pytest.mark.parametrize("value", ["", {"user": "root"}])
def test_a_block_without_a_password_is_refused_naming_it(prefect_harness: None,
                                                         value: Any) -> None:
    sid = new_store_id()
    Secret(value=value).save(root_password_block_name(sid))
    with pytest.raises(ValueError, match=rf"Secret block 'store-{sid}-root-password' holds no "
                                         r"password .*delete the block"):
        store_root_password(sid)


def test_the_hash_is_sha512_crypt_of_the_password_and_kept_when_it_still_is() -> None:
    password = SecretStr("Kc7mQ2xWpa9RtH4vNe8u")
    hashed = root_password_hash(password)
    assert hashed.startswith("$6$") and password.get_secret_value() not in hashed
    assert sha512_crypt.verify(password.get_secret_value(), hashed)
    glibc = glibc_crypt(password.get_secret_value(), hashed)
    assert glibc in (None, hashed)  # the C library's crypt(3) takes it as it is
    assert root_password_hash(password) != hashed  # a salt of its own each time...
    assert root_password_hash(password, hashed) == hashed  # ...but Cobbler's is kept on a rerun
    # another password, Cobbler's default or garbage in the record: a new hash of this password
    for current in (root_password_hash(SecretStr("another one")), COBBLER_DEFAULT_HASH,
                    "$6$broken", "!"):
        renewed = root_password_hash(password, current)
        assert renewed != current and sha512_crypt.verify(password.get_secret_value(), renewed)


def test_the_hash_uses_the_documented_rounds_and_renews_a_weaker_one() -> None:
    password = SecretStr("Kc7mQ2xWpa9RtH4vNe8u")
    hashed = root_password_hash(password)
    assert hashed.startswith("$6$rounds=656000$"), hashed  # docs/production.md
    assert sha512_crypt.from_string(hashed).rounds == 656000
    # a record written by an older release (glibc's 5000 rounds) gets a hash of today's rounds
    old = sha512_crypt.using(rounds=5000).hash(password.get_secret_value())
    renewed = root_password_hash(password, old)
    assert renewed != old and sha512_crypt.from_string(renewed).rounds == 656000


def test_the_hash_reaches_the_record_but_no_plan_or_repr() -> None:
    settings = load_settings(BASE_ENV)
    hashed = root_password_hash(SecretStr("Kc7mQ2xWpa9RtH4vNe8u"))
    spec = system_spec(store(), *spec_parts(settings), "tok-0042", hashed)
    assert spec.autoinstall_meta[ROOT_PASSWORD_HASH_META] == hashed
    assert hashed not in repr(spec) and "tok-0042" not in repr(spec)
    record = {"name": spec.name, "autoinstall_meta": {**spec.autoinstall_meta,
                                                      ROOT_PASSWORD_HASH_META: "$6$old$x"}}
    described = [c.describe() for c in system_changes(spec, record)]
    assert f"autoinstall_meta.{ROOT_PASSWORD_HASH_META}: changes (secret, not shown)" in described
    assert not any("$6$" in d for d in described)
    # a new record: the field is named, its value is not
    assert not any("$6$" in c.describe() for c in system_changes(spec, None))
    # a plan's spec has no hash (a plan never reads the password): nothing about it
    planned = system_spec(store(), *spec_parts(settings), token="")
    assert ROOT_PASSWORD_HASH_META not in planned.autoinstall_meta
    assert not [c for c in system_changes(planned, record) if ROOT_PASSWORD_HASH_META in c.field]


def test_update_repositories_default_to_the_platforms_own() -> None:
    settings = load_settings(BASE_ENV)
    assert settings.hypervisor_update_repos is None  # unset: each store's platform's
    # a SLES host's update repositories come from its registration server: none added
    sles = system_spec(store(), *spec_parts(settings), "tok").autoinstall_meta
    assert sles[UPDATE_REPOS_META] == ""
    assert sles["registration_url"] == "https://rmt.invalid"
    # a Leap 16.0 host keeps Leap's repo-oss (its updates land there), under Leap's own alias,
    # and registers nowhere
    leap = load_settings({**BASE_ENV, "STORE_ROLLOUT_HYPERVISOR_PLATFORM": "sle16-kvm",
                          "STORE_ROLLOUT_SLE16_PRODUCT": "leap"})
    meta = system_spec(store(), *spec_parts(leap), "tok").autoinstall_meta
    assert meta[UPDATE_REPOS_META] == f"repo-oss={LEAP16_UPDATE_REPOS[0]}"
    assert "leap/16.0/repo/oss" in LEAP16_UPDATE_REPOS[0] and "registration_url" not in meta
    assert meta["install_product"] == "Leap_16.0" and meta["store_platform"] == "sle16-kvm"


def test_update_repositories_travel_as_alias_url_pairs() -> None:
    assert update_repos_meta(["http://mirror.invalid/leap/15.6/oss", "http://a.invalid/x/oss/",
                              "ftp://b.invalid/updates/"]) == (
        "repo-update=http://mirror.invalid/leap/15.6/oss update-2=http://a.invalid/x/oss/ "
        "update-3=ftp://b.invalid/updates/")
    assert update_repos_meta([]) == ""
    mirror = load_settings({**BASE_ENV, "STORE_ROLLOUT_HYPERVISOR_UPDATE_REPOS":
                            "http://mirror.invalid/oss/ http://mirror.invalid/sle/"})
    assert mirror.hypervisor_update_repos == ["http://mirror.invalid/oss/",
                                              "http://mirror.invalid/sle/"]


@pytest.mark.parametrize(("value", "message"), [
    ("mirror.invalid/oss", r"\['mirror.invalid/oss'\] not repository URLs"),
    ('["http://m.invalid/a?x=1&y=2"]', r"none of <>&"),
    ('["http://m.invalid/a/", "http://m.invalid/a/"]', "lists a repository twice"),
    ('["http://m.invalid/a/"', "not a JSON list"),
])
def test_bad_update_repositories_are_refused_naming_the_setting(value: str, message: str) -> None:
    from store_rollout.settings import SettingsError

    with pytest.raises(SettingsError, match=rf"hypervisor_update_repos: .*{message}.*"
                                            r"STORE_ROLLOUT_HYPERVISOR_UPDATE_REPOS"):
        load_settings({**BASE_ENV, "STORE_ROLLOUT_HYPERVISOR_UPDATE_REPOS": value})
