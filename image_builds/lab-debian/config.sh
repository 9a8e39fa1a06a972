#!/bin/bash
# KIWI config.sh for lab-debian: runs in the image chroot after the packages and the root/
# overlay (../overlays/salt-minion, shared with leap-jeos) are in place.
set -euxo pipefail
test -f /.kconfig && . /.kconfig
test -f /.profile && . /.profile

# Build parameters: same mechanism as leap-jeos (see ../README.md).
/usr/local/libexec/store-rollout/apply-build-params /etc/store-rollout/build-params /etc/salt/minion.d
rm -rf /etc/store-rollout /usr/local/libexec/store-rollout
chmod 0640 /etc/salt/minion.d/*.conf

# No baked identity.
rm -f /etc/salt/minion_id /etc/salt/minion.d/15-identity.conf
rm -f /etc/salt/pki/minion/minion.pem /etc/salt/pki/minion/minion.pub

systemctl enable store-identity.service
if [[ "${kiwi_profiles:-}" == *Disk* ]]; then
    systemctl enable ssh
fi
# salt-minion is not in Debian 12's archive: nothing to enable here.
systemctl set-default multi-user.target
