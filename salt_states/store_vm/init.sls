include:
  - store_vm.config
