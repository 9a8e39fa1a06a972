#!/bin/bash
# KIWI config.sh for lab-debian: runs in the image chroot after the packages and the root/
# overlay (image_builds/overlays/salt-minion, shared with leap16-jeos) are in place.
set -euxo pipefail
test -f /.kconfig && . /.kconfig
test -f /.profile && . /.profile

# Build parameters: same mechanism as leap16-jeos (see image_builds/README.md).
/usr/local/libexec/store-rollout/apply-build-params /etc/store-rollout/build-params /etc/salt/minion.d
rm -rf /etc/store-rollout /usr/local/libexec/store-rollout
chmod 0640 /etc/salt/minion.d/*.conf

# No baked identity.
rm -f /etc/salt/minion_id /etc/salt/minion.d/15-identity.conf

# No machine identity either: systemd makes the machine-id at first boot, SSH host keys are
# made by store-ssh-hostkeys.service (two VMs from one image must not share them).
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id /etc/ssh/ssh_host_*
rm -rf /etc/salt/pki  # no minion keys: each VM makes its own

# salt-minion is not in Debian 12's archive: a pinned Salt in /opt/salt, installed offline from
# the wheelhouse the build host made (tasks/kiwi/builders.py KiwiBuilder.add_wheelhouse).
wheelhouse=/usr/local/share/store-rollout/wheelhouse
python3 -m venv /opt/salt
/opt/salt/bin/pip install --no-index --no-deps --find-links "$wheelhouse" \
    --requirement "$wheelhouse/minion-requirements.lock"
rm -rf /usr/local/share/store-rollout /root/.cache/pip
touch /etc/salt/minion
cat > /etc/systemd/system/salt-minion.service <<'UNIT'
[Unit]
Description=The Salt Minion (pinned, /opt/salt)
Documentation=man:salt-minion(1)
Wants=network-online.target
After=network-online.target store-identity.service
# its keys are on the store's data disk (minion.d/30-data-disk.conf): not without it
RequiresMountsFor=/srv/store

[Service]
Type=simple
ExecStart=/opt/salt/bin/salt-minion
KillMode=process
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT

# DHCP on the first NIC (net.ifnames=0 on the kernel command line: eth0)
mkdir -p /etc/systemd/network
cat > /etc/systemd/network/20-eth0.network <<'NET'
[Match]
Name=eth0

[Network]
DHCP=ipv4
NET
systemctl enable systemd-networkd systemd-networkd-wait-online.service

# the data disk (LABEL=STORE_DATA) at /srv/store before store-identity and the minion
mkdir -p /srv/store
systemctl enable srv-store.mount store-identity.service salt-minion.service
if [[ "${kiwi_profiles:-}" == *Disk* ]]; then
    cat > /etc/systemd/system/store-ssh-hostkeys.service <<'UNIT'
[Unit]
Description=SSH host keys of this machine, made at its first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
RequiredBy=ssh.service
UNIT
    systemctl enable store-ssh-hostkeys.service ssh
fi
systemctl set-default multi-user.target
