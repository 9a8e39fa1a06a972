{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
{%- set conf_dir = salt['file.dirname'](opts['conf_file']) %}
{%- set uri = salt['config.get']('virt:connection:uri', hv.libvirt.uri) %}
# The store_libvirt_events engine (Salt's libvirt_events callbacks on a connection it keeps
# across libvirt restarts): the store VMs' lifecycle events reach the master's bus, whose
# store_prefect_events engine forwards them to Prefect. The install profile wrote this same text;
# a change restarts the minion once. No state for the engine module itself: every highstate
# syncs `_engines` before it runs (a saltutil state would report a change in test mode), and the
# engine restarts itself when a sync replaced its file.
hypervisor-events-init-file-managed:
  file.managed:
    - name: {{ (conf_dir ~ '/minion.d/' ~ hv.events.conf) | json }}
    - contents: |
        engines:
          - {{ hv.events.engine }}:
              uri: {{ uri | yaml_squote }}
              tag_prefix: {{ hv.events.tag_prefix }}
              filters: {{ hv.events.filters | json }}

hypervisor-events-init-module-run:
  module.run:
    - provisioning.restart_minion:
      - reason: libvirt_events engine configuration changed
      - unit: {{ hv.events.minion_unit | json }}
    - onchanges:
      - file: hypervisor-events-init-file-managed
