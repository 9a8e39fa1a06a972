"""What a store looks like on the real systems, and what `plan` and `reconcile` conclude from it.

`facts`: one store as Cobbler, the Salt master, its hypervisor's libvirt, the image cache, the
ERP and Prefect report it (tasks/observe.py reads them, changing nothing). `plan`: step by step,
what a rollout started now would do. `reconcile`: each disagreement between those systems and
Prefect's last rollout run, with the command that settles it. `render`: the plan's Markdown and
the reconcile table. Pure functions of the facts, so every rule is unit-tested without a lab;
each step's "already done" rule itself is store_rollout/step_rules.py's, shared with the tasks.
"""
