{%- set tplroot = tpldir %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
# Production: Xen, libvirt, bridge br0, virt.keys, checks, ready event.
# Lab (pillar hypervisor:lookup:lab): only checks + ready; nothing that changes the lab host.
include: {{ hv.active_includes | json }}
