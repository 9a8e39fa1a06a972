# Re-announce firstboot progress under one master-side tag, so a watcher can subscribe to a single prefix.
reactor-firstboot-progress-runner-event-send:
  runner.event.send:
    - args:
      - tag: store/rollout/progress
      - data:
          minion: {{ data['id'] }}
          tag: {{ tag }}
