{%- set tplroot = tpldir %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
# The concerns `includes` names for the host's platform (parameters/platform/): its boot concern
# (Xen or KVM), libvirt, the events engine, checks, the ready event.
include: {{ hv.includes | json }}
