provisioning-helper-firstboot-new-saltutil-sync-modules:
  saltutil.sync_modules:
    - refresh: True

provisioning-helper-firstboot-new-event-send:
  event.send:
    - name: store/vm/firstboot/started
    - data:
        stage: new

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
    - require:
      - grains: provisioning-helper-firstboot-new-grains-present
      - saltutil: provisioning-helper-firstboot-new-saltutil-sync-modules
