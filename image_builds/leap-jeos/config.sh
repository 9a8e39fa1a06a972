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

# No baked identity: store-identity.service sets minion_id + autosign token from SMBIOS.
rm -f /etc/salt/minion_id /etc/salt/minion.d/15-identity.conf
rm -f /etc/salt/pki/minion/minion.pem /etc/salt/pki/minion/minion.pub
# No machine identity either: systemd makes the machine-id at first boot, sshd.service its host
# keys (sshd-gen-keys-start); two VMs from one image must not share them.
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id /etc/ssh/ssh_host_*

systemctl enable sshd
systemctl enable store-identity.service
systemctl enable salt-minion
systemctl set-default multi-user.target
