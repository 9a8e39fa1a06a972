"""`store-rollout lab up | status | down`: bring the whole lab up, report on it, tear it down.

`up` is idempotent: services already running (same PID and start time as recorded) are kept,
dead ones are restarted on their recorded ports, and stale PIDs or sockets from a crashed lab
are cleared first. `down` stops every process the lab recorded, by process group.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import sys
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from lab import (
    backup_server,
    bmc_service,
    boxes,
    cobbler_dhcp,
    cobbler_service,
    libvirt_service,
    netboot,
    postgres,
    prefect_server,
    salt_master,
)
from lab import regions as lab_regions
from lab.prefect_access import PrefectAccess, TlsFiles, ensure_auth_file, ensure_tls
from lab.procs import (
    ProcessRecord,
    listens_on,
    spawn,
    stop,
    stop_many,
    tree_rss,
    wait_until,
)
from lab.state import (
    COBBLER_PASSWORD_BLOCK,
    COBBLER_VENV,
    ERP_TOKEN_BLOCK,
    REGISTRATION_CODE_BLOCK,
    LabInfo,
    LabPaths,
    LabPorts,
    LabSecrets,
    ServiceInfo,
    state_dir_from_env,
)
from lab.store_network import GATEWAY, StoreNetwork, machine_address
from store_rollout.private_files import write_private

# start order; `down` stops in reverse (dependants first)
SERVICE_ORDER = ["store-network", "postgres", "prefect-server", "salt-master",
                 lab_regions.SECOND_MASTER, "libvirtd", "cobblerd", "cobbler-http",
                 "cobbler-dnsmasq", "erp-receiver", "webhook-receiver", "vbmcd", "redfish-bmc",
                 "backup-server", "simulator", "prefect-worker", lab_regions.SECOND_WORKER]


@dataclass
class Lab:
    paths: LabPaths
    ports: LabPorts
    secrets: LabSecrets

    @classmethod
    def at(cls, state_dir: Path | None = None) -> Lab:
        paths = LabPaths(state_dir_from_env(state_dir))
        paths.root.mkdir(parents=True, exist_ok=True)
        paths.logs.mkdir(exist_ok=True)
        return cls(paths, paths.load_or_create_ports(), paths.load_or_create_secrets())

    # -- description -------------------------------------------------------------------
    def cobbler_config(self) -> cobbler_service.CobblerLabConfig:
        return cobbler_service.CobblerLabConfig(
            state_dir=self.paths.cobbler, venv=COBBLER_VENV,
            xmlrpc_port=self.ports.cobbler_xmlrpc, http_port=self.ports.cobbler_http,
            user=self.secrets.cobbler_user, password=self.secrets.cobbler_password,
            server_address=GATEWAY)  # what the store hosts fetch their profile from

    def bmc_config(self) -> bmc_service.BmcLabConfig:
        return bmc_service.BmcLabConfig(
            state_dir=self.paths.bmc, logs=self.paths.logs, vbmcd_port=self.ports.vbmcd,
            redfish_port=self.ports.redfish, user=self.secrets.bmc_user,
            password=self.secrets.bmc_password,
            libvirt_uri=libvirt_service.uri(self.paths.libvirt))

    def prefect_access(self) -> PrefectAccess:
        """The lab's Prefect API as its clients reach it (TLS with the lab CA, basic auth)."""
        return PrefectAccess(prefect_server.api_url(self.ports.prefect),
                             TlsFiles.at(self.paths.prefect_tls).ca, self.paths.prefect_auth)

    def base_info(self, services: dict[str, ServiceInfo]) -> LabInfo:
        p = self.ports
        access = self.prefect_access()
        return LabInfo(
            state_dir=str(self.paths.root),
            prefect_api_url=access.api_url,
            prefect_ui_url=access.ui_url,
            prefect_ca_file=str(access.ca_file), prefect_auth_file=str(access.auth_file),
            postgres_url=postgres.url(p.postgres, "***"),
            salt_master_config=str(self.paths.master_config),
            salt_master_address=GATEWAY,
            salt_publish_port=p.salt_publish, salt_ret_port=p.salt_ret,
            cobbler_url=f"http://127.0.0.1:{p.cobbler_xmlrpc}/",
            cobbler_http_url=f"http://127.0.0.1:{p.cobbler_http}",
            cobbler_user=self.secrets.cobbler_user, cobbler_password=self.secrets.cobbler_password,
            bmc_user=self.secrets.bmc_user, bmc_password=self.secrets.bmc_password,
            redfish_url=self.bmc_config().redfish_url, vbmcd_port=p.vbmcd,
            vbmc_dir=str(self.bmc_config().vbmc_dir),
            libvirt_uri=libvirt_service.uri(self.paths.libvirt),
            erp_url=f"http://127.0.0.1:{p.erp}",
            erp_token=self.secrets.erp_token,
            erp_log=str(self.paths.erp / "requests.jsonl"),
            notify_url=f"http://127.0.0.1:{p.webhook}/notify",
            notify_log=str(self.paths.root / "notifications" / "messages.jsonl"),
            simulator_url=f"http://127.0.0.1:{p.simulator}",
            image_cache_dir=str(self.paths.image_cache),
            image_base_url=f"http://{GATEWAY}:{p.image_server}",
            image_server_url=f"http://127.0.0.1:{p.image_server}",
            store_network_state=str(self.paths.store_network / "state.json"),
            vm_images_dir=str(self.paths.libvirt / "images"),
            backup_url=f"https://{GATEWAY}:{p.backup}",
            backup_admin_url=f"https://127.0.0.1:{p.backup_admin}",
            backup_ca_file=str(access.ca_file),
            services=services,
        )

    def recorded_services(self) -> dict[str, ServiceInfo]:
        info = self.paths.load_info()
        return dict(info.services) if info else {}

    # -- up ----------------------------------------------------------------------------
    def up(self, progress: Callable[[str], None] = lambda _m: None,
           full: bool | None = None, regions: int | None = None) -> LabInfo:
        """`full`: boot the real image for store VMs; `regions`: 1, or 2 for a second region
        with its own Salt master and worker (None: as this lab was before)."""
        started = time.monotonic()
        recorded = self.paths.load_info()
        if full is None:
            full = recorded.full if recorded else False
        if regions is None:
            regions = recorded.regions if recorded else 1
        services = {name: svc for name, svc in self.recorded_services().items()
                    if svc.record.alive()}
        if regions == 1:  # a second region no longer wanted
            for name in (lab_regions.SECOND_WORKER, lab_regions.SECOND_MASTER):
                if name in services:
                    stop(services.pop(name).record)
        if "store-network" not in services:
            # the machines' links died with the old gateway: the simulator restarts them, and
            # libvirtd (whose VMs' taps were there) starts on the new network
            for name in ("simulator", "libvirtd", "cobbler-dnsmasq"):
                if name in services:
                    stop(services.pop(name).record)
        self._clear_stale(services)
        # the Prefect API's credential and certificates, before anything that uses them
        tls = ensure_tls(self.paths.prefect_tls)
        ensure_auth_file(self.paths.prefect_auth)
        access = self.prefect_access()
        info = self.base_info(services)
        info.full = full
        lab_regions.describe(info, self.paths, self.ports, regions)
        self.paths.write_info(info)  # the simulator and fixtures read it while we start
        p = self.ports
        logs = self.paths.logs

        def ensure(name: str, address: str, start: Callable[[], ProcessRecord],
                   ready: Callable[[], object]) -> None:
            if name not in services:
                progress(f"starting {name}")
                rec = start()
                services[name] = ServiceInfo(address=address, pid=rec.pid,
                                             create_time=rec.create_time,
                                             log=str(logs / f"{name}.log"))
                info.services = services
                self.paths.write_info(info)
            ready()

        # the store network first: the simulator puts every machine it starts on it
        network_state = Path(info.store_network_state)
        network_state.parent.mkdir(exist_ok=True)
        ensure("store-network", f"{GATEWAY} (forwards {', '.join(map(str, self._forwarded()))})",
               lambda: spawn([sys.executable, "-m", "lab.store_network",
                              "--state-file", str(network_state),
                              *[f"--forward={port}" for port in self._forwarded()]],
                             logs / "store-network.log", cwd=_repo_root()),
               lambda: wait_until(
                   lambda: _network_up(network_state, services["store-network"].pid), 20,
                   "store network"))
        # independent daemons start together; readiness is awaited after all have spawned
        postgres.prepare(self.paths.postgres, self.secrets.postgres_password)
        backups = backup_server.BackupFiles.of(self.paths.root)
        backups.ensure_secrets()  # the key the master's ext_pillar reads
        salt_master.write_config(self.paths.salt, p.salt_publish, p.salt_ret, prefect=access,
                                 backup_pillar=backup_server.ext_pillar_config(
                                     self.paths.root, info.backup_url, info.backup_ca_file))
        if regions == 2:
            salt_master.write_config(self.paths.salt_region2, p.region2_salt_publish,
                                     p.region2_salt_ret, prefect=access,
                                     master_id=lab_regions.SECOND_MASTER_ID)
        store_network = StoreNetwork.load(network_state)
        libvirt_service.prepare(self.paths.libvirt, store_network.url(p.simulator))
        cob = self.cobbler_config()
        cobbler_service.prepare_state(cob)
        cobbler_dhcp.prepare(cob)
        installer_initrd = netboot.build_initramfs(cob.state_dir / "boot")
        self.paths.erp.mkdir(exist_ok=True)
        token_file = self.paths.erp / "token"
        write_private(token_file, self.secrets.erp_token)
        self.paths.image_cache.mkdir(exist_ok=True)

        noop: Callable[[], None] = lambda: None  # noqa: E731
        ensure("postgres", f"127.0.0.1:{p.postgres}",
               lambda: postgres.start(self.paths.postgres, p.postgres, logs / "postgres.log"), noop)
        ensure("salt-master", f"127.0.0.1:{p.salt_ret}",
               lambda: salt_master.start(self.paths.salt, logs / "salt-master.log"), noop)
        if regions == 2:
            ensure(lab_regions.SECOND_MASTER,
                   f"127.0.0.1:{p.region2_salt_ret} (region {lab_regions.SECOND_REGION})",
                   lambda: salt_master.start(self.paths.salt_region2,
                                             logs / f"{lab_regions.SECOND_MASTER}.log"), noop)
        ensure("libvirtd", info.libvirt_uri,
               lambda: libvirt_service.start(self.paths.libvirt, logs / "libvirtd.log",
                                             store_network), noop)
        ensure("erp-receiver", info.erp_url,
               lambda: spawn([sys.executable, "-m", "lab.erp_receiver", "--port", str(p.erp),
                              "--log", info.erp_log, "--token-file", str(token_file)],
                             logs / "erp-receiver.log", cwd=_repo_root()), noop)
        if "cobblerd" not in services or "cobbler-http" not in services:
            # dnsmasq lives in cobblerd's mount namespace: it goes with it
            for name in ("cobbler-dnsmasq", "cobbler-http", "cobblerd"):
                if name in services:
                    stop(services.pop(name).record)
            progress("starting cobblerd")
            recs = cobbler_service.start(cob)
            for name, rec in recs.items():
                address = info.cobbler_url if name == "cobblerd" else info.cobbler_http_url
                services[name] = ServiceInfo(address=address, pid=rec.pid,
                                             create_time=rec.create_time,
                                             log=str(self.paths.cobbler / "logs" / f"{name}.log"))
            info.services = services
            self.paths.write_info(info)
        postgres.wait_ready(self.paths.postgres, p.postgres, self.secrets.postgres_password)
        ensure("prefect-server", info.prefect_ui_url,
               lambda: prefect_server.start(
                   self.paths.prefect_home, p.prefect,
                   postgres.url(p.postgres, self.secrets.postgres_password),
                   logs / "prefect-server.log", tls, access.auth_file),
               noop)
        def lab_server(name: str, url: str, module: str, health: str, *args: str) -> None:
            """One of the lab's own small HTTP servers (`python -m lab.<module>`)."""
            ensure(name, url,
                   lambda: spawn([sys.executable, "-m", module, *args],
                                 logs / f"{name}.log", cwd=_repo_root()),
                   lambda: wait_until(lambda: _own_http_ok(services[name], url, health), 20,
                                      f"{name} (listening itself on {url})"))

        lab_server("image-server", info.image_server_url, "lab.image_server", "/_lab/health",
                   "--root", str(self.paths.image_cache), "--port", str(p.image_server))
        lab_server("webhook-receiver", f"http://127.0.0.1:{p.webhook}", "lab.webhook_receiver",
                   "/_lab/health", "--port", str(p.webhook), "--log", info.notify_log)
        ensure("backup-server", f"{info.backup_url} (stores), {info.backup_admin_url} (admin)",
               lambda: backup_server.start(self.paths.root, p.backup, p.backup_admin,
                                           logs / "backup-server.log"),
               lambda: wait_until(lambda: listens_on(services["backup-server"].record, p.backup)
                                  and listens_on(services["backup-server"].record,
                                                 p.backup_admin), 20, "backup server"))
        libvirt_service.wait_ready(self.paths.libvirt)
        bmc = self.bmc_config()
        bmc_service.prepare(bmc)
        ensure("vbmcd", f"{bmc_service.BMC_ADDRESS}:{p.vbmcd} (control)",
               lambda: bmc_service.start_vbmcd(bmc), noop)
        ensure("redfish-bmc", bmc.redfish_url, lambda: bmc_service.start_redfish(bmc), noop)
        probe = ThreadPoolExecutor(max_workers=1)  # beside the services still starting
        probed = probe.submit(libvirt_service.probe_capabilities, info.libvirt_uri)
        probe.shutdown(wait=False)
        info.vm_type = libvirt_service.vm_type(info.libvirt_uri) if full else "qemu"
        self.paths.write_info(info)
        lab_server("simulator", info.simulator_url, "lab.simulator", "/health",
                   "--state-dir", str(self.paths.root), "--port", str(p.simulator))
        bmc_service.wait_ready(bmc)
        cobbler_service.wait_ready(cob)
        cobbler_service.seed(cob, netboot.kernel().vmlinuz, installer_initrd)
        ensure("cobbler-dnsmasq", f"{GATEWAY} (DHCP, TFTP)",
               lambda: cobbler_dhcp.start(cob, services["cobblerd"].record, store_network,
                                          logs / "cobbler-dnsmasq.log"),
               lambda: cobbler_dhcp.wait_ready(cob, services["cobbler-dnsmasq"].record))
        wait_until(lambda: _http_ok(f"{info.erp_url}/_lab/health"), 20, "ERP receiver")
        salt_master.wait_ready(self.paths.master_config)
        if regions == 2:
            salt_master.wait_ready(Path(info.region2_salt_master_config))
        prefect_server.wait_ready(access)
        self._prefect_setup(info)
        worker_env = prefect_server.client_env(access, self.paths.root / "prefect-worker-home",
                                               self.paths.root)
        ensure("prefect-worker", f"work pool {prefect_server.work_pool()}",
               lambda: prefect_server.start_worker(worker_env, logs / "prefect-worker.log"),
               lambda: prefect_server.wait_worker_online(access))
        if regions == 2:
            pool, name = lab_regions.SECOND_POOL, f"lab-worker-{lab_regions.SECOND_REGION}"
            ensure(lab_regions.SECOND_WORKER, f"work pool {pool}",
                   lambda: prefect_server.start_worker(
                       {**worker_env, "STORE_ROLLOUT_REGION": lab_regions.SECOND_REGION},
                       logs / f"{lab_regions.SECOND_WORKER}.log", pool=pool, name=name),
                   lambda: prefect_server.wait_worker_online(access, pool=pool, name=name))
        probed.result(timeout=120)
        dead = [name for name, svc in services.items() if not svc.record.alive()]
        if dead:
            raise RuntimeError(
                f"lab: {', '.join(dead)} exited after start (is its port taken by a process the "
                f"lab did not start?); see the logs in {logs}")
        info.services = services
        self.paths.write_info(info)
        progress(f"lab up in {time.monotonic() - started:.1f}s")
        return info

    def _forwarded(self) -> list[int]:
        """The orchestrator's ports a store host reaches (at the gateway): the master, Cobbler's
        HTTP side (profiles, nopxe), the image server, the simulated hardware's API (the
        lab's stand-in for a reboot), the second region's master (in any lab: a second
        region then comes up without a new gateway) and the backup target's stores' endpoint."""
        p = self.ports
        return [p.salt_publish, p.salt_ret, p.cobbler_http, p.image_server, p.simulator,
                p.region2_salt_publish, p.region2_salt_ret, p.backup]

    def _prefect_setup(self, info: LabInfo) -> None:
        """Server-side objects the flows rely on (idempotent): the Cobbler sync limit and the
        dead-run automation (`store-rollout prefect-setup`, as in production), the work pool
        and the deployments of prefect.yaml (UI and REST API runs)."""
        access = self.prefect_access()
        env = prefect_server.client_env(access, self.paths.prefect_home, self.paths.root)
        import subprocess

        from lab.approvers import save_approvers_block
        from lab.state import VENV_BIN

        # the Blocks first: prefect-setup's automations send through the notification block
        prefect_server.save_bmc_block(access, info.bmc_block, info.bmc_user,
                                      info.bmc_password)
        prefect_server.save_secret_blocks(access, {
            COBBLER_PASSWORD_BLOCK: info.cobbler_password, ERP_TOKEN_BLOCK: info.erp_token,
            # a SLES registration code's stand-in: step 2 puts it in the record, step 4 clears it
            REGISTRATION_CODE_BLOCK: secrets.token_hex(8).upper()})
        prefect_server.save_notification_block(access, info.notify_block,
                                               info.notify_url)
        save_approvers_block(access)
        backup_server.save_backup_block(access, info.backup_block, info.backup_admin_url,
                                        backup_server.BackupFiles.of(self.paths.root))
        # side by side with the deployments (each is seconds of CLI start and Prefect import)
        setup = subprocess.Popen([str(VENV_BIN / "store-rollout"), "prefect-setup"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            prefect_server.register_deployments(access, env,
                                                self.paths.logs / "prefect-deploy.log")
        finally:
            said, _ = setup.communicate(timeout=120)
        if setup.returncode != 0:
            raise RuntimeError(f"lab: `store-rollout prefect-setup` failed: {said[-2000:]}")

    def _clear_stale(self, alive: dict[str, ServiceInfo]) -> None:
        """Leftovers of a crashed lab: group members of dead leaders, stale pid/socket files."""
        for name, svc in self.recorded_services().items():
            if name not in alive:
                stop(svc.record)  # kills remaining group members of a dead leader
        if "postgres" not in alive:
            pid = self.paths.postgres / "data" / "postmaster.pid"
            if pid.exists():
                pid.unlink()
        for name, salt_dir in (("salt-master", self.paths.salt),
                               (lab_regions.SECOND_MASTER, self.paths.salt_region2)):
            if name not in alive:  # a stale pidfile stops salt-master from starting
                (salt_dir / "root" / "master" / "salt-master.pid").unlink(missing_ok=True)
        if "simulator" not in alive:
            self._stop_simulated_minions()

    def _minion_process_files(self) -> list[Path]:
        base = self.paths.simulator / "minions"
        return list(base.glob("*/process.json")) if base.exists() else []

    def _simulated_minions(self) -> list[ProcessRecord]:
        records = []
        for pfile in self._minion_process_files():
            try:
                records.append(ProcessRecord.from_json(json.loads(pfile.read_text())))
            except (FileNotFoundError, ValueError):
                continue  # the simulator replaced it meanwhile
        return records

    def _stop_simulated_minions(self) -> None:
        pfiles = self._minion_process_files()
        stop_many(self._simulated_minions(), grace=2.0)  # all at once: a lab may hold dozens
        for pfile in pfiles:
            pfile.unlink(missing_ok=True)

    def stop_service(self, name: str) -> None:
        """Stop one service (fault tests); the next `up` starts it again on the same port."""
        services = self.recorded_services()
        svc = services.get(name)
        if svc is not None:
            stop(svc.record)

    def restart_libvirtd(self) -> ProcessRecord:
        """Stop libvirtd and start it again at once, as a store host's daemon restarts (an
        update, a crash); the VMs carry on (QEMU runs in sessions of its own) and the new
        daemon takes them over. Only libvirtd: `up` would also redo the lab's setup (Cobbler
        seed, Prefect deployments), which takes far longer than the daemon's restart."""
        info = self.paths.load_info()
        if info is None or "libvirtd" not in info.services:
            raise RuntimeError("no lab libvirtd to restart: run `lab up`")
        stop(info.services["libvirtd"].record)
        record = libvirt_service.start(self.paths.libvirt, self.paths.logs / "libvirtd.log",
                                       StoreNetwork.load(Path(info.store_network_state)))
        info.services["libvirtd"] = info.services["libvirtd"].model_copy(
            update={"pid": record.pid, "create_time": record.create_time})
        self.paths.write_info(info)
        libvirt_service.wait_ready(self.paths.libvirt)
        return record

    # -- status ------------------------------------------------------------------------
    def status(self) -> list[dict[str, Any]]:
        rows = []
        for name, svc in sorted(self.recorded_services().items(),
                                key=lambda kv: SERVICE_ORDER.index(kv[0])
                                if kv[0] in SERVICE_ORDER else 99):
            alive = svc.record.alive()
            rows.append({"service": name, "address": svc.address, "pid": svc.pid,
                         "alive": alive, "rss_bytes": tree_rss(svc.record) if alive else 0})
        return rows

    def minion_rows(self) -> list[dict[str, Any]]:
        base = self.paths.simulator / "minions"
        book = self.paths.machine_addresses
        indexes: dict[str, int] = json.loads(book.read_text()) if book.exists() else {}
        rows = []
        for pfile in sorted(base.glob("*/process.json")) if base.exists() else []:
            try:
                rec = ProcessRecord.from_json(json.loads(pfile.read_text()))
            except (FileNotFoundError, ValueError):
                continue
            index = indexes.get(pfile.parent.name)
            rows.append({"service": f"minion {pfile.parent.name}",
                         "address": "-" if index is None else machine_address(index),
                         "pid": rec.pid, "alive": rec.alive(),
                         "rss_bytes": tree_rss(rec) if rec.alive() else 0})
        return rows

    # -- down ----------------------------------------------------------------------------
    def down(self, purge: bool = False) -> None:
        services = self.recorded_services()
        info = self.paths.load_info()
        if info is not None:  # the boxes' own libvirtds (the simulator started them) by PID
            boxes.power_cut_all(self.paths.root, info.vm_images_dir)
        self._destroy_domains(services)
        # in tiers, each stopped side by side (one grace period per tier, not per service):
        # the services, then the database the Prefect server used, then the network they all sat on
        # the simulated machines' minions go with the first tier: a salt-minion needs about 6 s
        # to leave on SIGTERM, so their grace ends in SIGKILL in any case
        # a purged lab's state goes next: nothing a graceful stop would save is kept, but
        # PostgreSQL still shuts down cleanly (a killed one leaves its System V segment)
        last = ("postgres", "store-network")
        stop_many([svc.record for name, svc in services.items() if name not in last]
                  + self._simulated_minions(), grace=0.2 if purge else 3.0)
        for name in last:
            if name in services:
                stop(services[name].record,
                     grace=5.0 if name == "postgres" else 0.2 if purge else 3.0)
        self._stop_simulated_minions()  # any the simulator started meanwhile
        self._stop_orphan_qemus()
        info = self.paths.load_info()
        if info is not None:
            info.services = {}
            self.paths.write_info(info)
        if purge:
            shutil.rmtree(self.paths.root, ignore_errors=True)

    def _stop_orphan_qemus(self) -> None:
        """QEMU daemonizes into its own session; its pidfiles live in the lab's private /run."""
        import psutil

        for pidfile in (self.paths.libvirt / "ns" / "run" / "libvirt" / "qemu").glob("*.pid"):
            try:
                pid = int(pidfile.read_text().strip())
                proc = psutil.Process(pid)
                if any("qemu-system" in part for part in proc.cmdline()[:1]):
                    proc.kill()
                    proc.wait(5)
            except (ValueError, OSError, psutil.Error):
                pass

    def switch_off_machines(self) -> int:
        """Power off every running machine of the lab (store hosts and their VMs: the simulator
        stops a machine's minion with its domain); how many were running. Between tests: each
        lab test uses stores of its own, and an idle machine's minion and libvirt events engine
        cost every later test CPU."""
        return self._destroy_domains(self.recorded_services())

    def _destroy_domains(self, services: dict[str, ServiceInfo]) -> int:
        """Stop lab VMs while libvirtd still answers, so no QEMU outlives the lab."""
        svc = services.get("libvirtd")
        if svc is None or not svc.record.alive():
            return 0
        try:
            import libvirt

            conn = libvirt.open(libvirt_service.uri(self.paths.libvirt))
            domains = conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE)
            # one by one a test session's dozens of domains took 40-60 s; libvirtd handles
            # each domain's destroy job on its own, so they can run side by side
            with ThreadPoolExecutor(max_workers=8) as pool:
                list(pool.map(_destroy_quietly, domains))
            conn.close()
            return len(domains)
        except Exception:  # libvirtd is stopped next anyway; QEMU dies with its group
            return 0


def _destroy_quietly(dom: Any) -> None:
    with contextlib.suppress(Exception):  # gone meanwhile; the QEMU sweep catches the rest
        dom.destroy()


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def _network_up(state_file: Path, pid: int) -> bool:
    try:
        return StoreNetwork.load(state_file).pid == pid
    except (RuntimeError, ValueError):
        return False


def _own_http_ok(service: ServiceInfo, url: str, health: str) -> bool:
    """The lab's server answers, and it is the lab's: the process the lab started listens on the
    port (another lab's server on the same port would answer the same health check)."""
    port = urllib.parse.urlsplit(url).port
    return port is not None and listens_on(service.record, port) and _http_ok(f"{url}{health}")


def _http_ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False

