{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
# Last state of the highstate: record readiness (checked after subscribing) and announce it.
hypervisor-ready-init-grains-present:
  grains.present:
    - name: {{ hv.ready.grain }}
    - value: True
    - require:
      - sls: {{ tplroot }}.checks

hypervisor-ready-init-event-send:
  event.send:
    - name: {{ hv.ready.tag }}
    - data:
        store_id: {{ salt['grains.get']('store_id', '') | json }}
        minion: {{ opts['id'] | json }}
    - require:
      - grains: hypervisor-ready-init-grains-present
