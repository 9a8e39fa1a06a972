include:
  - store_vm.config
  - store_vm.services
