{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
# Ready means ready: the libvirt connection answers with the expected driver (Xen in
# production), where required the host runs as Xen dom0, the commands step 5 runs here
# exist, and br0 still has the addressing AutoYaST gave it. Fails with what is wrong; reads
# only, so a test=True run (plan) checks too and reports no change.
hypervisor-checks-init-storehost-checked:
  storehost.checked:
    - name: hypervisor ready to run store VMs
    - driver: {{ hv.checks.driver | json }}
    - require_dom0: {{ hv.checks.require_dom0 | json }}
    - tools: {{ hv.checks.tools | json }}
    - bridge: {{ hv.checks.bridge | json }}
