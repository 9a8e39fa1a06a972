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

{%- if hv.libvirt.tls_conf %}
{%- set allowed = [] %}
{%- for dn in hv.libvirt.tls_allowed_dns %}
{%-   do allowed.append(dn | format(grains['store_id'])) %}
{%- endfor %}
{%- set dn_line = 'tls_allowed_dn_list = %s' | format(allowed | json) %}

# the TLS listener lets in the store's own boxes only (a refresh's migration, issue 48)
hypervisor-libvirt-init-tls-allowed-dn:
  file.replace:
    - name: {{ hv.libvirt.tls_conf | json }}
    - pattern: '^#?\s*tls_allowed_dn_list\s*=.*$'
    - repl: {{ dn_line | json }}
    - append_if_not_found: true
    - require:
      - pkg: hypervisor-libvirt-init-pkg-installed
{%- endif %}

{%- for unit in hv.libvirt.enabled %}

hypervisor-libvirt-init-service-running-{{ unit }}:
  service.running:
    - name: {{ unit }}
    - enable: true
    - require:
      - pkg: hypervisor-libvirt-init-pkg-installed
{%- endfor %}
