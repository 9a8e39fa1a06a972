{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
{%- set conf_dir = salt['file.dirname'](opts['conf_file']) %}
# The minion's link to its master over a WAN that drops (keepalive, reconnects, re-authentication:
# store_rollout/contracts.py MINION_LINK_SETTINGS, why each value): the install profile wrote this
# same text, so a host installed since changes nothing; an older host gets it, and its minion is
# restarted once (after this state run returned) to take it.
hypervisor-link-init-file-managed:
  file.managed:
    - name: {{ (conf_dir ~ '/minion.d/' ~ hv.link.conf) | json }}
    - contents: |
        {%- for key, value in hv.link.settings.items() %}
        {{ key }}: {{ value | json }}
        {%- endfor %}

hypervisor-link-init-module-run:
  module.run:
    - provisioning.restart_minion:
      - reason: minion link settings changed
      - unit: {{ hv.events.minion_unit | json }}
    - onchanges:
      - file: hypervisor-link-init-file-managed
