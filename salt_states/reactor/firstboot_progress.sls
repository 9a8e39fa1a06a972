# Re-announce firstboot progress under one master-side tag, so a watcher can subscribe to a
# single prefix.
# Renders data, never code: the tag and the data are the sending minion's word (a minion's batch
# event is fired as it wrote it, `id` included, and reactor.yaml's `*` matches a newline), so the
# reaction exists only for a tag that is exactly one of firstboot's events, and each event value
# is written with yaml_dquote: one double-quoted scalar, escaped by YAML's own emitter.
# tests/unit/salt_states/test_reactor_render.py renders this file with Salt's reactor.
{%- set firstboot_prefix = 'store/vm/firstboot/' %}
{%- set firstboot_events = ['started', 'highstate', 'report', 'done'] %}
{%- set event = tag[firstboot_prefix | length:] if tag is string and tag.startswith(firstboot_prefix) else none %}
{%- if event in firstboot_events %}
{%- set minion = data.get('id', '') if data is mapping else '' %}
reactor-firstboot-progress-runner-event-send:
  runner.event.send:
    - args:
      - tag: store/rollout/progress
      - data:
          minion: {{ minion | string | yaml_dquote }}
          tag: {{ tag | yaml_dquote }}
{%- endif %}
