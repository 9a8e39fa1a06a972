{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
# libvirt as the platform runs it (parameters/platform/): its modular daemons' units enabled
# (virtxend or virtqemud), the monolithic libvirtd's masked.
hypervisor-libvirt-init-pkg-installed:
  pkg.installed:
    - pkgs: {{ hv.libvirt.pkgs | json }}

{%- for unit in hv.libvirt.masked %}

hypervisor-libvirt-init-service-masked-{{ unit }}:
  service.masked:
    - name: {{ unit }}
    - require:
      - pkg: hypervisor-libvirt-init-pkg-installed
{%- endfor %}

{%- for unit in hv.libvirt.enabled %}

hypervisor-libvirt-init-service-running-{{ unit }}:
  service.running:
    - name: {{ unit }}
    - enable: true
    - require:
      - pkg: hypervisor-libvirt-init-pkg-installed
{%- endfor %}
