# Custom modules (provisioning.reboot, storevirt.*) must be on every minion before its states need them.
reactor-sync-modules-local-saltutil-sync-all:
  local.saltutil.sync_all:
    - tgt: {{ data['id'] }}
