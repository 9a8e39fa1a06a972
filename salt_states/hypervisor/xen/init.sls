{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
hypervisor-xen-init-pkg-installed:
  pkg.installed:
    - pkgs: {{ hv.xen.pkgs | json }}

hypervisor-xen-init-file-replace:
  file.replace:
    - name: /etc/default/grub
    - pattern: '^GRUB_DEFAULT=.*$'
    - repl: 'GRUB_DEFAULT="{{ hv.xen.grub_default }}"'
    - append_if_not_found: True
    - require:
      - pkg: hypervisor-xen-init-pkg-installed

hypervisor-xen-init-cmd-run:
  cmd.run:
    - name: grub2-mkconfig -o /boot/grub2/grub.cfg
    - onchanges:
      - file: hypervisor-xen-init-file-replace
