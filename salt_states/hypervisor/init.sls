{%- set tplroot = tpldir %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
# Xen, libvirt, bridge br0, virt.keys, checks, ready event: the concerns `includes` names.
include: {{ hv.includes | json }}
