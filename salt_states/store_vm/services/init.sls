{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as vm with context %}
include:
  - {{ tplroot }}.data

# Each service with a `unit`: its unit file, its working directory, running and enabled (so it
# starts again at every boot: the go-live gate checks it after firstboot's last reboot).
{%- for name, service in vm.services | dictsort %}
{%-   if service.unit is defined %}
store-vm-services-init-file-directory-{{ name }}:
  file.directory:
    - name: {{ salt['provisioning.root_path'](service.directory) }}
    - makedirs: True

store-vm-services-init-file-managed-{{ name }}:
  file.managed:
    - name: {{ salt['provisioning.root_path']('etc/systemd/system', service.unit ~ '.service') }}
    - makedirs: True
    - mode: '0644'
    - contents: |
        # File managed by Salt (store_vm) - changes will be overwritten
        [Unit]
        Description=store server: {{ name }}
        Wants=network-online.target
        After=network-online.target

        [Service]
        WorkingDirectory=/{{ service.directory }}
        ExecStart={{ service.command }}
        Restart=on-failure

        [Install]
        WantedBy=multi-user.target

store-vm-services-init-service-running-{{ name }}:
  service.running:
    - name: {{ service.unit }}
    - enable: True
    - require:
      - sls: {{ tplroot }}.data
      - file: store-vm-services-init-file-directory-{{ name }}
    - watch:
      - file: store-vm-services-init-file-managed-{{ name }}
{%-   endif %}
{%- endfor %}
