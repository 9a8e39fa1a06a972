{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
# Boot into Xen (sles15-xen): the default entry is saved by its exact title (grub's
# 20_linux_xen names it "<OS>, with Xen hypervisor"; AutoYaST's bootloader import has no default
# entry), then one reboot while the host is not yet a Xen dom0. The reboot's startup highstate runs this formula again.
hypervisor-xen-init-pkg-installed:
  pkg.installed:
    - pkgs: {{ hv.xen.pkgs | json }}

hypervisor-xen-init-file-replace:
  file.replace:
    - name: {{ hv.xen.grub_defaults }}
    - pattern: '^GRUB_DEFAULT=.*$'
    - repl: 'GRUB_DEFAULT=saved'
    - append_if_not_found: true
    - require:
      - pkg: hypervisor-xen-init-pkg-installed

hypervisor-xen-init-cmd-run:
  cmd.run:
    - name: {{ hv.xen.mkconfig }} -o {{ hv.xen.grub_cfg }}
    - onchanges:
      - file: hypervisor-xen-init-file-replace
      - pkg: hypervisor-xen-init-pkg-installed

hypervisor-xen-init-storehost-xen-default-boot:
  storehost.xen_default_boot:
    - name: {{ hv.xen.grub_cfg }}
    - require:
      - cmd: hypervisor-xen-init-cmd-run

hypervisor-xen-dom0-cmd-run:
  cmd.run:
    - name: {{ hv.xen.reboot | json }}
    - unless: grep -qs control_d /proc/xen/capabilities
    - require:
      - storehost: hypervisor-xen-init-storehost-xen-default-boot
