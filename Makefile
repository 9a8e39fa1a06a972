# store-rollout: `make demo` and `make test` do everything on a fresh Debian 12 machine.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
VENV ?= $(CURDIR)/.venv
COBBLER_VENV ?= $(CURDIR)/.venv-cobbler
PY := $(VENV)/bin/python
# pytest-xdist workers for `make test`, each with a lab of its own: one per core (with 3 on 2
# cores the labs' timeouts fired and CI failed)
TEST_WORKERS ?= 2
STAMP_APT := $(CURDIR)/.setup-apt.stamp
STAMP_VENV := $(VENV)/.setup.stamp
STAMP_COBBLER := $(COBBLER_VENV)/.setup.stamp
# the Salt of a Leap 15.6 store host (3006, built-in virt): the lab's hypervisor minions run it
HOST_SALT_VENV ?= $(CURDIR)/.venv-salt3006
STAMP_HOST_SALT := $(HOST_SALT_VENV)/.setup.stamp
# the interpreter and Salt a Leap 15.6 store host runs (Python 3.6.15, Salt 3006.0): host-side
# code is called under it (tests/unit/salt_states/test_host_python36.py); any CPython 3.6 will do
# (docs/lab.md)
HOST_PY36_VENV ?= $(CURDIR)/.venv-host-py36
STAMP_HOST_PY36 := $(HOST_PY36_VENV)/.setup.stamp
# the lab's BMC emulators (VirtualBMC for IPMI, sushy-tools for Redfish), apart from the app
BMC_VENV ?= $(CURDIR)/.venv-bmc
STAMP_BMC := $(BMC_VENV)/.setup.stamp
# what a store host's network boot loads in the lab (lab/netboot.py): Debian's kernel and the
# busybox of its installer, PXELINUX; taken out of their .debs, never installed on this machine
NETBOOT_DIR ?= $(CURDIR)/.cache/netboot
STAMP_NETBOOT := $(NETBOOT_DIR)/.setup.stamp
NETBOOT_FILES := ./boot/vmlinuz-* ./lib/modules/*/kernel/drivers/virtio/* \
	./lib/modules/*/kernel/drivers/net/virtio_net.ko ./lib/modules/*/kernel/drivers/net/net_failover.ko \
	./lib/modules/*/kernel/net/core/failover.ko ./lib/modules/*/kernel/drivers/block/virtio_blk.ko \
	./bin/busybox ./usr/lib/PXELINUX/pxelinux.0 ./usr/lib/syslinux/modules/bios/ldlinux.c32
PYTHON36 ?= $(shell for p in "$$(pyenv prefix 3.6 2>/dev/null)/bin/python3.6" python3.6; do \
	"$$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 6))' 2>/dev/null && command -v "$$p" && break; done)

APT_PACKAGES := postgresql postgresql-contrib rsync qemu-utils qemu-system-x86 \
	libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-dev pkg-config \
	fdisk gdisk util-linux e2fsprogs libmagic1 iproute2 procps chromium \
	xorriso libxml2-utils dnsmasq-base ipmitool curl systemd dmidecode rclone restic

.PHONY: setup demo test test-durations test-slow test-scale test-bench test-full test-fleet test-extended lint bench ui-screenshots lab-up lab-down lab-status clean

# Salt 3006.0, the minion Leap 15.6 hosts run: its source (never installed) for the compatibility test
SALT3006_SDIST := $(CURDIR)/.cache/salt-3006.0.tar.gz
SALT3006_SHA256 := ee2c38b34ea861409013c81cf0aa85297d69cf10773b73ee7a0710b5c942dcca

setup: $(STAMP_APT) $(STAMP_VENV) $(STAMP_COBBLER) $(STAMP_HOST_SALT) $(STAMP_HOST_PY36) $(STAMP_BMC) $(STAMP_NETBOOT) $(SALT3006_SDIST)

# the kernel package linux-image-amd64 points at today (security updates replace it)
$(STAMP_NETBOOT): $(STAMP_APT)
	rm -rf $(NETBOOT_DIR) && mkdir -p $(NETBOOT_DIR)/debs $(NETBOOT_DIR)/root
	cd $(NETBOOT_DIR)/debs && apt-get download -q \
	  $$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $$2; exit}') \
	  busybox-static pxelinux syslinux-common
	for deb in $(NETBOOT_DIR)/debs/*.deb; do \
	  dpkg-deb --fsys-tarfile "$$deb" | tar -x -C $(NETBOOT_DIR)/root --wildcards $(NETBOOT_FILES) 2>/dev/null; \
	done; rm -rf $(NETBOOT_DIR)/debs
	ls $(NETBOOT_DIR)/root/boot/vmlinuz-* $(NETBOOT_DIR)/root/bin/busybox \
	  $(NETBOOT_DIR)/root/usr/lib/PXELINUX/pxelinux.0 $(NETBOOT_DIR)/root/usr/lib/syslinux/modules/bios/ldlinux.c32
	touch $@

$(SALT3006_SDIST): $(STAMP_VENV)
	mkdir -p $(dir $@)
	$(VENV)/bin/pip download -q --no-deps --no-binary :all: salt==3006.0 -d $(dir $@)
	echo "$(SALT3006_SHA256)  $@" | sha256sum -c -

$(STAMP_APT): Makefile
	@if ! dpkg -s $(APT_PACKAGES) >/dev/null 2>&1; then \
	  export DEBIAN_FRONTEND=noninteractive; \
	  mkdir -p /etc/postgresql-common; \
	  test -e /etc/postgresql-common/createcluster.conf || echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $(APT_PACKAGES); \
	fi
	touch $@

# the application, then the lab: its own distribution (lab/pyproject.toml, never in the wheel),
# which adds `store-rollout lab ...` and the lab's image builder through entry points
$(STAMP_VENV): pyproject.toml lab/pyproject.toml requirements.lock $(STAMP_APT)
	test -x $(PY) || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r requirements.lock
	$(VENV)/bin/pip install -q --no-deps -e .
	$(VENV)/bin/pip install -q --no-deps -e lab
	touch $@

$(STAMP_COBBLER): $(STAMP_APT)
	test -x $(COBBLER_VENV)/bin/python || python3 -m venv $(COBBLER_VENV)
	$(COBBLER_VENV)/bin/pip install -q --no-deps cobbler==3.3.10
	$(COBBLER_VENV)/bin/pip install -q Cheetah3==3.2.6.post1 distro==1.9.0 dnspython==2.9.2 \
	  file-magic==0.4.1 netaddr==1.3.0 PyYAML==6.0.3 requests==2.34.2 schema==0.7.8
	touch $@

$(STAMP_HOST_SALT): requirements-salt3006.lock $(STAMP_APT)
	test -x $(HOST_SALT_VENV)/bin/python || python3 -m venv $(HOST_SALT_VENV)
	$(HOST_SALT_VENV)/bin/pip install -q --no-deps -r requirements-salt3006.lock
	$(HOST_SALT_VENV)/bin/salt-call --version
	touch $@

$(STAMP_HOST_PY36): requirements-host-py36.lock $(STAMP_APT)
	@test -x "$(PYTHON36)" || { echo "CPython 3.6 not found (python3.6 on PATH or 'pyenv install 3.6.15'; or make PYTHON36=/path/to/python3.6)"; exit 1; }
	test -x $(HOST_PY36_VENV)/bin/python || $(PYTHON36) -m venv $(HOST_PY36_VENV)
	$(HOST_PY36_VENV)/bin/pip install -q 'pip==21.3.1'
	$(HOST_PY36_VENV)/bin/pip install -q --no-deps -r requirements-host-py36.lock
	$(HOST_PY36_VENV)/bin/salt-call --version
	touch $@

$(STAMP_BMC): requirements-bmc.lock $(STAMP_APT)
	test -x $(BMC_VENV)/bin/python || python3 -m venv $(BMC_VENV)
	$(BMC_VENV)/bin/pip install -q --no-deps -r requirements-bmc.lock
	$(BMC_VENV)/bin/vbmc --version && $(BMC_VENV)/bin/sushy-emulator --help >/dev/null
	touch $@

demo: setup
	$(VENV)/bin/store-rollout lab up
	$(VENV)/bin/store-rollout lab demo --inventory examples/inventory.yaml

# what runs on a store host under its Python 3.6 (the master's engines run on the master: not
# here; the hypervisor's libvirt events engine does). The store VM (image_builds/leap16-jeos) loads
# the same _modules (provisioning, storegate) under the Salt Bundle's Python 3.11: 3.6 stays the floor
HOST_PYTHON_PATHS := salt_states/_modules salt_states/_pillar lab/salt_overlay/_modules salt_states/_states salt_states/_utils salt_states/_engines/store_libvirt_events.py tests/host36 lab/host_namespace.py

lint: setup
	$(VENV)/bin/vermin -q -t=3.6- --violations --no-tips $(HOST_PYTHON_PATHS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/salt-lint $$(find salt_states -name '*.sls' | sort)
	$(VENV)/bin/yamllint --strict .

test: lint
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=40

# tests/durations.json (the xdist order: longest first) from a run of the default suite
test-durations: setup
	STORE_ROLLOUT_RECORD_DURATIONS=1 $(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadgroup

test-slow: setup
	$(VENV)/bin/pytest -q -m kiwi_build

test-scale: setup
	$(VENV)/bin/pytest -q -m scale

# bench --quick runs whose behaviour default tests cover (tests/lab/test_bench.py lists which)
test-bench: setup
	$(VENV)/bin/pytest -q -m bench_covered

# the full lab: store VMs boot the KIWI-built image (built on the first run, about 4 min)
test-full: setup
	$(VENV)/bin/pytest -q -rP -m full_lab tests/lab/test_full_lab.py

# the lab's fault matrix, plan and reconcile, after-go-live features: past what `make test` covers
test-extended: setup
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=20 -m extended

test-fleet: setup
	$(VENV)/bin/pytest -q -rP -n 2 -m fleet tests/lab/test_slots.py tests/lab/test_faults.py \
	  tests/lab/test_bench.py tests/lab/test_windows_lab.py tests/lab/test_approvals_lab.py \
	  tests/fleet/test_regions_lab.py

bench: setup
	$(VENV)/bin/store-rollout lab up
	mkdir -p bench/results
	for b in bench/bench_*.py; do $(PY) $$b | tee bench/results/$$(basename $$b .py).json || exit 1; done

# docs/ui/*.png: the pages the browser test visits, taken from a lab run (docs/ui.md shows them)
ui-screenshots: setup
	rm -f docs/ui/*.png
	STORE_ROLLOUT_UI_SCREENSHOTS=$(CURDIR)/docs/ui $(VENV)/bin/pytest -q -m lab tests/lab/test_ui.py \
	  tests/lab/test_windows_lab.py::test_a_batch_schedules_its_canary_into_its_window_and_waits_for_it \
	  tests/lab/test_fleet_view_ui.py

lab-up: setup
	$(VENV)/bin/store-rollout lab up
lab-status: setup
	$(VENV)/bin/store-rollout lab status
lab-down: setup
	$(VENV)/bin/store-rollout lab down

clean:
	-$(VENV)/bin/store-rollout lab down
	rm -rf .lab $(STAMP_APT)
