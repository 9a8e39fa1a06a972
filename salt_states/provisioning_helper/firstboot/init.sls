# First boot of a store-server VM, staged by the `firstboot_stage` grain across reboots:
#   new -> (reboot) -> highstate: store_vm + report -> (reboot) -> verify: remove bootstrap -> done
# Run by `startup_states: sls` from the image's bootstrap minion.d file.
include:
  - provisioning_helper.firstboot.{{ salt['grains.get']('firstboot_stage', 'new') }}
