include:
  - store_vm.data
  - store_vm.config
  - store_vm.services
