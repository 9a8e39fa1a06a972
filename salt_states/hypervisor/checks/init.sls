# The hypervisor is only useful when its libvirt connection answers (xen:///system in production).
hypervisor-checks-init-module-run:
  module.run:
    - virt.node_info: []
