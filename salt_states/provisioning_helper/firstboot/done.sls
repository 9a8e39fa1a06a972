provisioning-helper-firstboot-done-test-nop:
  test.nop:
    - name: firstboot already done
