{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
hypervisor-libvirt-init-pkg-installed:
  pkg.installed:
    - pkgs: {{ hv.libvirt.pkgs | json }}

hypervisor-libvirt-init-service-running:
  service.running:
    - name: {{ hv.libvirt.service }}
    - enable: True
    - require:
      - pkg: hypervisor-libvirt-init-pkg-installed
