{%- set tplroot = tpldir.split('/')[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata as hv with context %}
# KVM (sle16-kvm): the CPU's kvm module (kvm_intel or kvm_amd, chosen in map.jinja by the
# cpu_flags grain) loaded, so its device exists for libvirt's QEMU driver. The kernel loads the
# module at boot by the CPU's modalias: this state loads it when it is not, and fails when it
# cannot be. virtqemud's sockets and the masked libvirtd are hypervisor.libvirt's (parameters/
# platform/sle16-kvm.yaml).
hypervisor-kvm-init-kmod-present:
  kmod.present:
    - name: {{ hv.kvm.module | json }}

hypervisor-kvm-init-file-exists:
  file.exists:
    - name: {{ hv.kvm.device | json }}
    - require:
      - kmod: hypervisor-kvm-init-kmod-present
