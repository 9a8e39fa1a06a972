# The store-server role's states (what top.sls assigns to role:store-server), then the report.
include:
  - store_vm

provisioning-helper-firstboot-highstate-event-send:
  event.send:
    - name: store/vm/firstboot/highstate
    - data:
        result: true
        boot_id: {{ salt['file.read']('/proc/sys/kernel/random/boot_id') | trim | json }}
    - require:
      - sls: store_vm

provisioning-helper-firstboot-highstate-grains-present:
  grains.present:
    - name: firstboot_stage
    - value: verify
    - require:
      - event: provisioning-helper-firstboot-highstate-event-send

provisioning-helper-firstboot-highstate-report-event-send:
  event.send:
    - name: store/vm/firstboot/report
    - data:
        os: {{ grains.get('osfinger', grains.get('os', '')) | json }}
        ipv4: {{ grains.get('ipv4', []) | json }}
        role: {{ grains.get('role', '') | json }}
    - require:
      - grains: provisioning-helper-firstboot-highstate-grains-present

provisioning-helper-firstboot-highstate-module-run:
  module.run:
    - provisioning.reboot:
      - reason: firstboot-highstate
      - delay_minutes: {{ salt['pillar.get']('provisioning:reboot_delay_minutes', 1) | int }}
    - require:
      - event: provisioning-helper-firstboot-highstate-report-event-send
