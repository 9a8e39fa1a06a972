# reload_modules: this state run's own loader gets the synced modules (provisioning.reboot below);
# without it the run relied on the loader finding the new file on a miss, and one VM of a
# 100-run burst failed with "Unavailable function: provisioning.reboot"
provisioning-helper-firstboot-new-saltutil-sync-modules:
  saltutil.sync_modules:
    - refresh: True
    - reload_modules: True

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
      - saltutil: provisioning-helper-firstboot-new-saltutil-sync-states

# the custom states too (storedata.mounted, store_vm.data): firstboot runs its states with
# state.sls, which syncs nothing by itself (a highstate's autoload_dynamic_modules does)
provisioning-helper-firstboot-new-saltutil-sync-states:
  saltutil.sync_states:
    - refresh: False
