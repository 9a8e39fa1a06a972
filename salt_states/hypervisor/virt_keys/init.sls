{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
# libvirt TLS keys for migration between hypervisors (Salt Virt docs: virt.keys).
hypervisor-virt-keys-init-virt-keys:
  virt.keys:
    - country: {{ hv.virt_keys.country }}
    - state: {{ hv.virt_keys.state }}
    - locality: {{ hv.virt_keys.locality }}
    - organization: {{ hv.virt_keys.organization }}
    - require:
      - sls: {{ tplroot }}.libvirt
