{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
# Bridge for the store VM, as in the Salt Virt docs (wicked on openSUSE).
hypervisor-network-init-network-managed:
  network.managed:
    - name: {{ hv.bridge.name }}
    - type: bridge
    - proto: dhcp
    - bridge: {{ hv.bridge.name }}
    - delay: 0
    - ports: {{ hv.bridge.port }}
    - bypassfirewall: True
    - use:
      - network: hypervisor-network-init-port-managed

hypervisor-network-init-port-managed:
  network.managed:
    - name: {{ hv.bridge.port }}
    - type: eth
    - proto: none
    - bridge: {{ hv.bridge.name }}
