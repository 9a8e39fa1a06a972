#!/bin/bash
# KIWI config.sh for leap16-jeos: runs in the image chroot after the packages and the root/
# overlay (../overlays/salt-minion) are in place.
set -euxo pipefail
test -f /.kconfig && . /.kconfig
test -f /.profile && . /.profile
if type suseSetupProduct >/dev/null 2>&1; then suseSetupProduct; fi

# Build parameters (SALT_MASTER, SALT_MASTER_PORT, ...): substitute the @KEY@ placeholders
# in minion.d from /etc/store-rollout/build-params (written by tasks/kiwi.py into its copy
# of the description) or the caller's environment; then drop the build-only files.
/usr/local/libexec/store-rollout/apply-build-params /etc/store-rollout/build-params /etc/salt/minion.d
rm -rf /etc/store-rollout /usr/local/libexec/store-rollout

# The minion is the Salt Bundle (Leap 16.0 has no salt package): venv-salt-minion.service
# reads /etc/venv-salt-minion (minion.d, minion_id, pki/minion), not /etc/salt. The shared
# overlay's minion.d files move there; store-identity writes there (drop-in below).
mkdir -p /etc/venv-salt-minion/minion.d
mv /etc/salt/minion.d/*.conf /etc/venv-salt-minion/minion.d/
rm -rf /etc/salt/minion.d
rmdir --ignore-fail-on-non-empty /etc/salt
chmod 0640 /etc/venv-salt-minion/minion.d/*.conf

# No baked identity: store-identity.service sets minion_id + autosign token from the seed disk.
rm -f /etc/venv-salt-minion/minion_id /etc/venv-salt-minion/minion.d/15-identity.conf
rm -f /etc/venv-salt-minion/pki/minion/minion.pem /etc/venv-salt-minion/pki/minion/minion.pub
# No machine identity either: systemd makes the machine-id at first boot, sshd.service its host
# keys (sshd-gen-keys-start); two VMs from one image must not share them.
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id /etc/ssh/ssh_host_*

# DHCP on the first NIC, the same first boot as the Debian test image: no jeos-firstboot or
# cloud-init here to write it. eth0 because config.xml passes net.ifnames=0 (why: see there).
# NetworkManager is Leap 16's only network stack; it reads a keyfile only when root owns it
# with mode 0600. NetworkManager-wait-online.service holds network-online.target until the
# connection is up.
mkdir -p /etc/NetworkManager/system-connections
cat > /etc/NetworkManager/system-connections/eth0.nmconnection <<'NET'
[connection]
id=eth0
type=ethernet
interface-name=eth0
autoconnect=true

[ipv4]
method=auto

[ipv6]
method=auto
NET
chmod 0600 /etc/NetworkManager/system-connections/eth0.nmconnection
systemctl enable NetworkManager.service NetworkManager-wait-online.service

# The Bundle's minion starts after the lease and after store-identity wrote the identity. The
# overlay's store-identity.service names the distribution minion (salt-minion.service, which
# this image does not have): this drop-in ties it to the Bundle's unit and its directory.
mkdir -p /etc/systemd/system/store-identity.service.d
cat > /etc/systemd/system/store-identity.service.d/salt-bundle.conf <<'UNIT'
[Unit]
Before=venv-salt-minion.service

[Service]
Environment=STORE_IDENTITY_SALT_DIR=/etc/venv-salt-minion
UNIT
mkdir -p /etc/systemd/system/venv-salt-minion.service.d
cat > /etc/systemd/system/venv-salt-minion.service.d/store-first-boot.conf <<'UNIT'
[Unit]
Wants=network-online.target
Requires=store-identity.service
After=network-online.target store-identity.service
# its keys are on the store's data disk (minion.d/30-data-disk.conf): not without it
RequiresMountsFor=/srv/store
UNIT
# the data disk (LABEL=STORE_DATA) at /srv/store before store-identity and the Bundle's minion
mkdir -p /etc/systemd/system/srv-store.mount.d
cat > /etc/systemd/system/srv-store.mount.d/salt-bundle.conf <<'UNIT'
[Unit]
Before=venv-salt-minion.service
UNIT
mkdir -p /srv/store

systemctl enable sshd.service
systemctl enable srv-store.mount
systemctl enable store-identity.service
systemctl enable venv-salt-minion.service
systemctl set-default multi-user.target
