{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as vm with context %}
# The role keeps its state on the data disk: before anything of it is written, the mount point
# must be that disk's mount (the image mounts it; mounted here when it did not). On a minion
# with a private root_dir (a simulated VM) the directory under that root stands for it.
store-vm-data-init-storedata-mounted:
  storedata.mounted:
    - name: {{ vm.data_disk.mount }}
    - label: {{ vm.data_disk.label }}
    - fstype: {{ vm.data_disk.fstype }}
