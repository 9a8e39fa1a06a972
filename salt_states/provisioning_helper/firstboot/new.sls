provisioning-helper-firstboot-new-saltutil-sync-modules:
  saltutil.sync_modules:
    - refresh: True

provisioning-helper-firstboot-new-event-send:
  event.send:
    - name: store/vm/firstboot/started
    - data:
        stage: new
        boot_id: {{ salt['file.read']('/proc/sys/kernel/random/boot_id') | trim | json }}

provisioning-helper-firstboot-new-grains-present:
  grains.present:
    - name: firstboot_stage
    - value: highstate
    - require:
      - event: provisioning-helper-firstboot-new-event-send

provisioning-helper-firstboot-new-module-run:
  module.run:
    - provisioning.reboot:
      - reason: firstboot-new
      - delay_minutes: {{ salt['pillar.get']('provisioning:reboot_delay_minutes', 1) | int }}
    - require:
      - grains: provisioning-helper-firstboot-new-grains-present
      - saltutil: provisioning-helper-firstboot-new-saltutil-sync-modules
