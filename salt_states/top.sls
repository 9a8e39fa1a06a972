# Roles come from the `role` grain baked into the install (AutoYaST) or the image (KIWI overlay).
base:
  'role:hypervisor':
    - match: grain
    - hypervisor
  'role:store-server':
    - match: grain
    - store_vm
