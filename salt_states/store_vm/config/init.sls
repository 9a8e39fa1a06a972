{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as vm with context %}
include:
  - {{ tplroot }}.data

# Paths are under the minion's root_dir: / on the real VM, else the minion's private root_dir.
# The go-live gate (the storegate module, run through the master) reads its checks from here.
store-vm-config-init-file-managed:
  file.managed:
    - name: {{ salt['provisioning.root_path'](vm.config_dir, vm.config_file) }}
    - makedirs: True
    - mode: '0640'
    - require:
      - sls: {{ tplroot }}.data
    - contents: |
        # File managed by Salt (store_vm) - changes will be overwritten
        store_id: {{ salt['grains.get']('store_id', '') | json }}
        minion_id: {{ opts['id'] | json }}
        data_disk: {{ vm.data_disk | json }}
        services: {{ vm.services | json }}
        go_live: {{ vm.go_live | json }}
