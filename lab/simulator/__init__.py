"""Store hardware simulator: the only simulated part of the lab.

- Store hosts: each is a libvirt domain behind a real BMC emulator (lab/hardware.py); the
  simulator follows its lifecycle. Default lab: on power on the "machine" does what its
  firmware and installer would: take the PXE config for its MAC over TFTP; if it points at an
  AutoYaST profile, fetch it from Cobbler, lay down the files it writes, start the hypervisor's
  salt-minion from them and call Cobbler's end-of-install (nopxe) URL; if it says localboot,
  boot the installed system. Full lab: the domain boots for real (lab/netboot.py) and the
  simulator starts the installed host once the serial console shows it booted from its disk,
  from the files the installer wrote there.
- VM boot: a libvirt lifecycle callback (not polling) starts a salt-minion for each started
  domain, with the minion.d files of the image the domain's disk is backed by. A domain
  whose disk holds a built image (the full lab) is left alone: QEMU boots it for real. The identity
  comes the way the guest gets it: the image's own store-identity script reads the domain's
  STORE_SEED seed disk (its CD-ROM's ISO file, as the guest would see it); a disk that booted
  before keeps the identity it was given. Stopping the domain stops that minion. A system disk
  keeps its own root, as a qcow2 overlay keeps its content: a domain switched to another system
  disk (an image update) and back (its revert) boots the old disk's root again.
- Reboot: the `provisioning.reboot` Salt module asks for a reboot here; the simulator restarts
  that minion process (never the host).
- Network: every machine's minion runs in a network namespace of its own on the lab's store
  network (lab/store_network.py), with an address the simulator assigns and keeps per
  machine; the firmware's downloads (profile, nopxe) go over that network too. Store hosts
  also get a mount namespace without the lab's state (lab/host_namespace.py).
- Units: a simulated machine's enabled systemd units (the store server's role services) start
  at each boot in its namespace before its minion (lab/salt_overlay/_modules/lab_service.py).
- Fault knobs per step (`pxe`, `startup_highstate`, `vm_boot`, `reboot`, `vm_start`,
  `service_start`: a boot at which the enabled units fail to start): delay, fail
  the next N times, never; `GET /faults/taken` counts the delays and failures they caused.
  `pxe` acts in the default lab only: the full lab's install is the real installer's.

Modules: faults (the knobs), minions (salt-minion processes per machine), firmware (BMC
power, PXE install, reboots), vm_boot (libvirt lifecycle events), data_disk and system_disks
(a VM's data disk and the roots of its system disks), http_api (the handler),
server (wiring and the entry point).

Run: python -m lab.simulator --state-dir <lab> --port <port>
"""
