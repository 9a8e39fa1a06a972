"""Regions: a chain's stores split over Salt masters, each region with its own master, Cobbler,
image server and work pool.

A store belongs to one region (the inventory's `region`, default `default`). The regions file
(`STORE_ROLLOUT_REGIONS_FILE`, YAML) names each region's work pool and the settings that differ
in it; a worker serves one region (`STORE_ROLLOUT_REGION`) and sees the chain's settings with its
region's on top. One Prefect server serves the chain: a region's runs are runs of the region's
deployments (`<deployment>-<region>`; the default region's keep prefect.yaml's names) in its
work pool, which only that region's workers poll.

    regions:
      default:
        work_pool: rollout-pool
      north:
        work_pool: rollout-north
        settings:
          salt_master_config: /etc/salt/master
          salt_master_address: salt-north.example
          cobbler_url: http://cobbler-north.example:25151/
          cobbler_credentials_block: cobbler-north
          cobbler_sync_limit: cobbler-sync-north
          image_base_url: https://images-north.example/store-images
          image_params: {SALT_MASTER: salt-north.example, SALT_MASTER_PORT: "4506"}
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

DEFAULT_REGION: Final = "default"
DEFAULT_WORK_POOL: Final = "rollout-pool"  # prefect.yaml's
DEFAULT_COBBLER_SYNC_LIMIT: Final = "cobbler-sync"  # one Cobbler's syncs never overlap
REGION_RE: Final = r"^[a-z][a-z0-9-]{0,23}$"
RegionName = Annotated[str, StringConstraints(pattern=REGION_RE)]
# what may differ between regions; secrets never (a region's Cobbler login is a Block)
REGION_SETTINGS: Final = frozenset({
    "salt_master_config", "salt_master_address", "salt_publish_port", "salt_ret_port",
    "cobbler_url", "cobbler_user", "cobbler_credentials_block", "cobbler_sync_limit",
    "bmc_credentials_block", "hypervisor_libvirt_uri", "hypervisor_update_repos",
    "hypervisor_platform", "registration_url", "registration_code_block",
    "image_base_url", "image_ca_bundle", "image_params", "image_rate_limit"})
SECRET_HINTS: Final = {"cobbler_password": "cobbler_credentials_block",
                       "erp_token": "the chain's erp_token (the ERP is one for the chain)"}


class RegionsError(ValueError):
    """The regions file, or a region named somewhere, is invalid; the message says how to fix it."""


class RegionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    work_pool: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$",
                           description="the Prefect work pool the region's workers poll")
    settings: dict[str, Any] = Field(default_factory=dict,
                                     description="the region's own settings (field: value)")

    @field_validator("settings")
    @classmethod
    def _region_scoped(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if name in SECRET_HINTS:
                raise ValueError(f"settings.{name}: no secret in the regions file; use "
                                 f"{SECRET_HINTS[name]}")
            if name not in REGION_SETTINGS:
                raise ValueError(f"settings.{name}: not a setting a region may change (those "
                                 f"are {', '.join(sorted(REGION_SETTINGS))})")
        return value


class Regions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    regions: dict[RegionName, RegionSpec] = Field(min_length=1)

    @field_validator("regions")
    @classmethod
    def _own_pools(cls, value: dict[str, RegionSpec]) -> dict[str, RegionSpec]:
        default = value.get(DEFAULT_REGION)
        if default is not None and default.work_pool != DEFAULT_WORK_POOL:
            raise ValueError(f"region {DEFAULT_REGION!r}: work_pool must be "
                             f"{DEFAULT_WORK_POOL!r}, prefect.yaml's (its runs are the "
                             "deployments `prefect deploy --all` registers there)")
        seen: dict[str, str] = {}
        for name, spec in value.items():
            if spec.work_pool in seen:
                raise ValueError(f"regions {seen[spec.work_pool]!r} and {name!r} share work pool "
                                 f"{spec.work_pool!r}: each region needs its own (its workers "
                                 "talk to its master only)")
            seen[spec.work_pool] = name
        return value

    def spec(self, region: str, where: str = "region") -> RegionSpec:
        if region not in self.regions:
            raise RegionsError(f"{where}: no region {region!r} in the regions file (known: "
                               f"{', '.join(self.regions)}); add it there or fix the name")
        return self.regions[region]


ONE_REGION: Final = Regions(regions={DEFAULT_REGION: RegionSpec(work_pool=DEFAULT_WORK_POOL)})


def load_regions(path: str | Path | None) -> Regions:
    """The regions file at `path`; one region, `default` on prefect.yaml's pool, without one.
    Parsed once per version of the file: every load_settings() call reads it."""
    if not path:
        return ONE_REGION
    try:
        stat = Path(path).stat()
    except OSError as exc:
        raise RegionsError(f"regions_file: cannot read {path} ({exc}); set "
                           "STORE_ROLLOUT_REGIONS_FILE to a YAML file of regions") from None
    return _parsed_regions(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _parsed_regions(path: str, _mtime_ns: int, _size: int) -> Regions:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RegionsError(f"regions_file: cannot read {path} ({exc}); set "
                           "STORE_ROLLOUT_REGIONS_FILE to a YAML file of regions") from None
    try:
        return Regions.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise RegionsError(f"regions file {path}: {problems}") from None


def regional_deployment(deployment: str, region: str) -> str:
    """`flow/deployment` of prefect.yaml as registered for `region` (its work pool's copy)."""
    return deployment if region == DEFAULT_REGION else f"{deployment}-{region}"


def regional_limit(limit: str, region: str) -> str:
    """A global concurrency limit of one region (e.g. its stores in flight)."""
    return f"{limit}-{region}"


def runs_in_region_pools(regions: Regions, serving: str, store_regions: list[str]) -> bool:
    """Whether a batch's stores run as runs of their regions' deployments, each in its region's
    work pool, not inside the batch's process: always in a chain of several regions (every
    store's run is then where its region's runs are, whichever stores a rerun has left), and
    for a store of another region than the process's."""
    return len(regions.regions) > 1 or any(region != serving for region in store_regions)


def wrong_region(store_id: str, store_region: str, serving: str, regions: Regions) -> str | None:
    """Why a process of region `serving` must not roll out a store of `store_region`, or None.
    Its master holds neither the store's keys nor its events: a run there would register the
    store on the wrong master."""
    if store_region == serving:
        return None
    known = regions.regions.get(store_region)
    where = (f"deployment store-rollout/{regional_deployment('store-rollout', store_region)}"
             f" in work pool {known.work_pool!r}" if known else
             "a region the regions file does not name: add it there")
    return (f"store {store_id}: region {store_region!r} (inventory), but this worker serves "
            f"region {serving!r} (STORE_ROLLOUT_REGION) and its Salt master: run it through "
            f"{where}")
