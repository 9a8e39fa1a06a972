# After the second reboot: the highstate's result is still there, then the bootstrap data goes.
provisioning-helper-firstboot-verify-file-exists:
  file.exists:
    - name: {{ salt['provisioning.root_path']('etc/store-server/store.yaml') }}

provisioning-helper-firstboot-verify-file-absent:
  file.absent:
    - names: {{ salt['provisioning.bootstrap_files']() | json }}
    - require:
      - file: provisioning-helper-firstboot-verify-file-exists

provisioning-helper-firstboot-verify-grains-present:
  grains.present:
    - name: firstboot_stage
    - value: done
    - require:
      - file: provisioning-helper-firstboot-verify-file-absent

provisioning-helper-firstboot-verify-event-send:
  event.send:
    - name: store/vm/firstboot/done
    - data:
        bootstrap_removed: {{ salt['provisioning.bootstrap_files']() | json }}
        boot_id: {{ salt['file.read']('/proc/sys/kernel/random/boot_id') | trim | json }}
    - require:
      - grains: provisioning-helper-firstboot-verify-grains-present
