#!/bin/bash
# KIWI config.sh for leap-jeos: runs in the image chroot after the packages and the root/
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
chmod 0640 /etc/salt/minion.d/*.conf

# No baked identity: store-identity.service sets minion_id + autosign token from the seed disk.
rm -f /etc/salt/minion_id /etc/salt/minion.d/15-identity.conf
rm -f /etc/salt/pki/minion/minion.pem /etc/salt/pki/minion/minion.pub
# No machine identity either: systemd makes the machine-id at first boot, sshd.service its host
# keys (sshd-gen-keys-start); two VMs from one image must not share them.
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id /etc/ssh/ssh_host_*

# DHCP on the first NIC, the same first boot as the Debian test image: no jeos-firstboot or
# cloud-init here to write it. eth0 because config.xml passes net.ifnames=0 (why: see there).
# wicked.service is not enabled by Leap's presets (an installed Leap gets it from YaST);
# it is ordered before network-online.target, which it holds until the lease is there (at
# most WAIT_FOR_INTERFACES of /etc/sysconfig/network/config).
cat > /etc/sysconfig/network/ifcfg-eth0 <<'NET'
BOOTPROTO='dhcp'
STARTMODE='auto'
NET
systemctl enable wicked.service

# Leap's salt-minion.service waits for network.target only, which does not wait for the
# lease: the minion's first start must find the master and the identity store-identity wrote.
mkdir -p /etc/systemd/system/salt-minion.service.d
cat > /etc/systemd/system/salt-minion.service.d/store-first-boot.conf <<'UNIT'
[Unit]
Wants=network-online.target
After=network-online.target store-identity.service
UNIT

systemctl enable sshd
systemctl enable store-identity.service
systemctl enable salt-minion
systemctl set-default multi-user.target
