{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
# Ready means ready: the libvirt connection answers with the platform's driver (Xen on
# sles15-xen, QEMU on sle16-kvm), where required the host runs as Xen dom0, the devices it needs
# exist (/dev/kvm on sle16-kvm), the commands step 5 runs here exist, and br0 still has the
# addressing the install profile gave it (read with iproute2: wicked or NetworkManager alike).
# Fails with what is wrong; reads only, so a test=True run (plan) checks too and reports no
# change.
hypervisor-checks-init-storehost-checked:
  storehost.checked:
    - name: hypervisor ready to run store VMs
    - driver: {{ hv.checks.driver | json }}
    - require_dom0: {{ hv.checks.require_dom0 | json }}
    - tools: {{ hv.checks.tools | json }}
    - devices: {{ hv.checks.devices | json }}
    - bridge: {{ hv.checks.bridge | json }}
