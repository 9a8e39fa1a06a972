"""Regions: the regions file, a worker's settings of its region, stores routed to their region,
and a batch whose regions wave and halt on their own (the two-region lab: test_regions_lab.py)."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from store_rollout.inventory import InventoryError, parse_inventory
from store_rollout.regions import (
    ONE_REGION,
    RegionsError,
    load_regions,
    regional_deployment,
    regional_limit,
    wrong_region,
)
from store_rollout.settings import SettingsError, load_settings
from store_rollout.waves import plan_region_waves, runs_of_their_own
from tasks.slots import in_flight_slots
from tests.unit.store_rollout.test_settings import BASE

CHAIN = {"STORE_ROLLOUT_IMAGE_BASE_URL": "https://images.example/s", **BASE}


def regions_file(tmp_path: Path, regions: dict[str, Any]) -> Path:
    path = tmp_path / "regions.yaml"
    path.write_text(yaml.safe_dump({"regions": regions}))
    return path


NORTH = {"work_pool": "rollout-north", "settings": {
    "salt_master_config": "/srv/north/master", "salt_ret_port": 14506,
    "cobbler_url": "https://cobbler-north:25151/", "cobbler_sync_limit": "cobbler-sync-north",
    "image_params": {"SALT_MASTER": "salt-north", "SALT_MASTER_PORT": "14506"}}}


def test_a_worker_sees_the_chain_s_settings_with_its_region_s_on_top(tmp_path: Path) -> None:
    path = regions_file(tmp_path, {"default": {"work_pool": "rollout-pool"}, "north": NORTH})
    chain = {**CHAIN, "STORE_ROLLOUT_REGIONS_FILE": str(path)}
    default = load_settings(chain)
    north = load_settings({**chain, "STORE_ROLLOUT_REGION": "north"})
    assert (default.region, default.salt_master_config, default.cobbler_sync_limit) == \
        ("default", "/etc/salt/master", "cobbler-sync")
    assert (north.region, north.salt_master_config, north.salt_ret_port, north.cobbler_url) == \
        ("north", "/srv/north/master", 14506, "https://cobbler-north:25151/")
    assert north.cobbler_sync_limit == "cobbler-sync-north"
    assert north.image_params == {"SALT_MASTER": "salt-north", "SALT_MASTER_PORT": "14506"}
    assert north.erp_url == default.erp_url  # the ERP is the chain's
    assert set(north.regions().regions) == {"default", "north"}


def test_a_worker_of_a_region_the_file_does_not_name_is_refused(tmp_path: Path) -> None:
    path = regions_file(tmp_path, {"default": {"work_pool": "rollout-pool"}, "north": NORTH})
    with pytest.raises(SettingsError, match=r"region \(STORE_ROLLOUT_REGION\): no region 'south' in "
                                            r"the regions file \(known: default, north\)"):
        load_settings({**CHAIN, "STORE_ROLLOUT_REGIONS_FILE": str(path),
                       "STORE_ROLLOUT_REGION": "south"})
    with pytest.raises(SettingsError, match="no region 'north'"):  # no file: one region
        load_settings({**CHAIN, "STORE_ROLLOUT_REGION": "north"})
    with pytest.raises(SettingsError, match="regions_file: cannot read"):
        load_settings({**CHAIN, "STORE_ROLLOUT_REGIONS_FILE": str(tmp_path / "none.yaml")})


@pytest.mark.parametrize(("region", "message"), [
    ({"work_pool": "p", "settings": {"cobbler_password": "x"}},
     "settings.cobbler_password: no secret in the regions file; use cobbler_credentials_block"),
    ({"work_pool": "p", "settings": {"approval_policy": "never"}},
     "settings.approval_policy: not a setting a region may change"),
    ({"work_pool": "rollout-pool"}, "share work pool 'rollout-pool'"),
    ({"work_pool": "p", "colour": "red"}, "colour: Extra inputs are not permitted"),
])
def test_the_regions_file_is_checked_field_by_field(tmp_path: Path, region: dict[str, Any],
                                                    message: str) -> None:
    path = regions_file(tmp_path, {"default": {"work_pool": "rollout-pool"}, "north": region})
    with pytest.raises(RegionsError, match=f"regions file {path}: .*{message}"):
        load_regions(path)


def test_the_default_region_keeps_prefect_yaml_s_pool(tmp_path: Path) -> None:
    with pytest.raises(RegionsError, match="region 'default': work_pool must be 'rollout-pool'"):
        load_regions(regions_file(tmp_path, {"default": {"work_pool": "rollout-south"}}))


def test_a_region_name_is_a_short_lowercase_word(tmp_path: Path) -> None:
    with pytest.raises(RegionsError, match="regions.North"):
        load_regions(regions_file(tmp_path, {"North": {"work_pool": "p"}}))
    assert load_regions("") == ONE_REGION
    assert ONE_REGION.spec("default").work_pool == "rollout-pool"


def test_a_store_belongs_to_the_default_region_unless_the_inventory_names_one() -> None:
    store = {"hypervisor": {"hostname": "hv.example", "mac": "52:54:00:00:00:01"},
             "erp": {"site_code": "S1"}}
    inventory = parse_inventory({"stores": [{"store_id": "0001", **store},
                                            {"store_id": "0002", "region": "north", **store,
                                             "hypervisor": {"hostname": "hv2.example",
                                                            "mac": "52:54:00:00:00:02"}}]})
    assert [s.region for s in inventory.stores] == ["default", "north"]
    with pytest.raises(InventoryError, match="region"):
        parse_inventory({"stores": [{"store_id": "0003", "region": "North Pole", **store}]})


def test_a_csv_inventory_has_a_region_column(tmp_path: Path) -> None:
    from store_rollout.inventory import load_inventory

    path = tmp_path / "stores.csv"
    path.write_text("store_id,region,hv_hostname,hv_mac,erp_site_code\n"
                    "0001,north,hv1.example,52:54:00:00:00:01,S1\n"
                    "0002,,hv2.example,52:54:00:00:00:02,S2\n")
    assert [s.region for s in load_inventory(path).stores] == ["north", "default"]


def test_a_store_of_another_region_is_refused_naming_its_deployment_and_pool(tmp_path: Path) -> None:
    regions = load_regions(regions_file(tmp_path, {"default": {"work_pool": "rollout-pool"},
                                                   "north": NORTH}))
    assert wrong_region("0001", "north", "north", regions) is None
    problem = wrong_region("0001", "north", "default", regions)
    assert problem == ("store 0001: region 'north' (inventory), but this worker serves region "
                       "'default' (STORE_ROLLOUT_REGION) and its Salt master: run it through "
                       "deployment store-rollout/store-rollout-north in work pool 'rollout-north'")
    assert "a region the regions file does not name" in str(
        wrong_region("0001", "south", "default", regions))


def test_each_region_has_its_deployments_and_limits() -> None:
    assert regional_deployment("store-rollout/store-rollout", "default") == \
        "store-rollout/store-rollout"
    assert regional_deployment("store-rollout/store-rollout", "north") == \
        "store-rollout/store-rollout-north"
    assert in_flight_slots("north") == ["stores-in-flight", regional_limit("stores-in-flight",
                                                                            "north")]
    assert in_flight_slots("north")[1] == "stores-in-flight-north"


def test_the_regional_deployments_are_all_but_the_chain_s_batch() -> None:
    from app.deployments import load_deployments, regional_specs

    names = {spec.name for spec in regional_specs()}
    assert "batch-rollout" not in names
    assert names == {spec.name for spec in load_deployments()} - {"batch-rollout"}
    assert {"store-rollout", "store-plan", "store-reconcile", "store-decommission"} <= names


def test_each_region_waves_on_its_own_side_by_side() -> None:
    regions = {"a1": "a", "a2": "a", "b1": "b", "a3": "a", "b2": "b", "b3": "b", "b4": "b"}
    assert plan_region_waves(regions, canary=1, wave_size=2) == [
        {"a": ["a1"], "b": ["b1"]},
        {"a": ["a2", "a3"], "b": ["b2", "b3"]},
        {"b": ["b4"]}]
    assert plan_region_waves({}, canary=1, wave_size=2) == []


def test_stores_of_a_chain_of_regions_are_runs_in_their_region_s_pool(tmp_path: Path) -> None:
    from store_rollout.regions import runs_in_region_pools

    assert runs_of_their_own("never", ignore_windows=True, calendars=False, other_regions=True)
    assert not runs_of_their_own("never", ignore_windows=True, calendars=False,
                                 other_regions=False)
    two = load_regions(regions_file(tmp_path, {"default": {"work_pool": "rollout-pool"},
                                               "north": NORTH}))
    assert not runs_in_region_pools(ONE_REGION, "default", ["default", "default"])
    # in a chain of regions, even a batch of the process's own region's stores (a rerun that
    # left only those) runs them in their pool
    assert runs_in_region_pools(two, "default", ["default"])
    assert runs_in_region_pools(ONE_REGION, "default", ["north"])


class FakeRuns:
    """A Prefect client's read_flow_runs over given runs, newest first, paged."""

    def __init__(self, runs: list[Any]) -> None:
        self.runs, self.calls = runs, 0

    def read_flow_runs(self, flow_filter: Any, flow_run_filter: Any, sort: Any, limit: int,
                       offset: int) -> list[Any]:
        self.calls += 1
        assert flow_filter.name.any_ == ["store-rollout"]
        names = set(flow_run_filter.name.any_)
        return [r for r in self.runs if r.name in names][offset:offset + limit]


def test_a_batch_finds_each_store_s_newest_rollout_run() -> None:
    from tasks.flow_runs import newest_rollout_runs

    def run(name: str, state: str) -> Any:
        return SimpleNamespace(name=name, state=state)

    runs = FakeRuns([run("rollout-s1", "newest"), run("rollout-s1", "older"),
                     run("rollout-s1", "oldest"), run("rollout-s2", "newest"),
                     run("rollout-s3", "newest")])
    found = newest_rollout_runs(runs, ["s1", "s2", "s3", "s4"], page=2)
    assert {sid: r.state for sid, r in found.items()} == {"s1": "newest", "s2": "newest",
                                                          "s3": "newest"}
    # names [s1, s2]: a second page of runs until s2's shows up; names [s3, s4]: one short page
    assert runs.calls == 3


def test_a_stopped_master_is_named_before_anything_is_done() -> None:
    from tasks.preflight import master_problem

    settings = SimpleNamespace(region="north", salt_master_config="/srv/north/master")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        opts = {"interface": "0.0.0.0", "ret_port": port, "id": "salt-north"}
        assert master_problem(settings, opts) is None  # type: ignore[arg-type]
    problem = master_problem(settings, opts)  # type: ignore[arg-type]
    assert problem is not None
    assert problem.startswith(f"salt_master_config: the Salt master of region 'north' "
                              f"(/srv/north/master, id 'salt-north') does not answer at "
                              f"127.0.0.1:{port} (")
    assert problem.endswith("): start it, then run again")


def test_a_region_halts_on_its_own_failures_only() -> None:
    from store_rollout.batch_rows import StoreRow
    from store_rollout.waves import regions_to_halt

    rows = [StoreRow(store_id=f"s{n}", region=region, state=state) for n, (region, state) in
            enumerate([("a", "Failed"), ("a", "Completed"), ("b", "Completed"),
                       ("b", "Completed"), ("b", "Completed"), ("b", "Completed"),
                       ("b", "Completed"), ("c", "Failed")])]
    # the chain's ratio (2 of 8) is above 0.2, but only a's (1 of 2) and c's are
    assert regions_to_halt(rows, ["a", "b", "c"], 0.2) == {"a": (1, 2), "c": (1, 1)}
    assert regions_to_halt(rows, ["b"], 0.2) == {}  # c already halted: not asked again


def test_a_store_of_another_region_is_refused_before_an_undo_or_a_rollout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from app.cli import app
    from store_rollout.inventory import load_inventory
    from tasks.preflight import PreflightError, check_region

    path = regions_file(tmp_path, {"default": {"work_pool": "rollout-pool"}, "north": NORTH})
    monkeypatch.setattr("os.environ", {**CHAIN, "STORE_ROLLOUT_REGIONS_FILE": str(path)})
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"stores": [{
        "store_id": "0002", "region": "north", "erp": {"site_code": "S2"},
        "hypervisor": {"hostname": "hv2.example", "mac": "52:54:00:00:00:02"}}]}))
    with pytest.raises(PreflightError, match="store 0002: region 'north' .* work pool "
                                             "'rollout-north'"):
        check_region(load_inventory(inventory).get("0002"), load_settings())
    for command in (["decommission", "0002"], ["rollback", "0002"], ["rollout", "0002"]):
        done = CliRunner().invoke(app, [*command, "--inventory", str(inventory)])
        assert done.exit_code == 2, (command, done.output)
        assert "store 0002: region 'north' (inventory), but this worker serves region " \
               "'default'" in " ".join(done.output.split()), (command, done.output)


def test_a_chain_wide_read_takes_a_region_s_result_from_its_artifact(
        prefect_harness: None) -> None:
    from prefect import flow
    from prefect.runtime import flow_run

    from tasks.region_runs import _published, publish_result, split_by_region

    @flow
    def regional_part() -> str:
        publish_result("store-reconcile", {"counts": {"ok": 1}, "stores": {"0002": "ok"}})
        return str(flow_run.id)

    run_id = regional_part()
    assert _published(run_id, "store-reconcile-result") == {"counts": {"ok": 1},
                                                            "stores": {"0002": "ok"}}
    store = {"hypervisor": {"hostname": "hv.example", "mac": "52:54:00:00:00:01"},
             "erp": {"site_code": "S"}}
    stores = parse_inventory({"stores": [{"store_id": "1", **store}, {
        "store_id": "2", "region": "north", "erp": {"site_code": "T"},
        "hypervisor": {"hostname": "hv2.example", "mac": "52:54:00:00:00:02"}}]}).stores
    own, others = split_by_region(stores, "default")
    assert [s.store_id for s in own] == ["1"] and others == {"north": ["2"]}

