"""The tasks layer: what the flows call, and the clients of the outside systems they call through
(above store_rollout/, below flows/). Its modules are of three kinds, named below once:

- **Step modules** (`STEP_MODULES`): the Prefect tasks (and the flow-side functions) of one step
  or one job of a flow, composing clients and helpers: pxe_install (step 2), salt_master (steps
  3 and 4, and the keys' removal), virt (step 5, staging), vm_removal (the VM's removal: rollback,
  decommission), data_export (a decommission's export of the data disk), firstboot (step 6),
  go_live (the go-live gate), box_move (a refresh's move of the store VM to the new box),
  image_update (an image update's and revert's changes, waits and
  checks), store_backup (a store's backup, its verification, a replacement's restore);
  retire_box (a replacement's first change), refresh_box (a hardware refresh's own
  reads, the old box's retirement and its ERP notice), approvals (the
  approval before step 1), preflight (the checks before any side effect), observe (what plan,
  reconcile and an approval read), reconcile_events, fleet_view (a region's table of its
  stores), store_runs (a batch's runs), region_runs
  (a chain-wide read's runs in other regions), undo (what a rollback or a decommission decides
  before it changes anything).
- **Clients** (`CLIENTS`): one package or module per outside system: its typed client, error
  tree and Blocks, and the thin tasks that call that system alone: step 1's `ensure_image`
  (kiwi/), the ERP notices (erp), the rollback's and decommission's Cobbler and BMC tasks, the
  region's backup server (backup: restic's admin side).
- **Helpers** (`HELPERS`): what several steps share without being an outside system's client:
  Blocks and the root password (blocks, root_password), retries and outside URLs (retry,
  transport), the store VM, its domain and its image's delivery (store_vm, vm_domain,
  image_delivery), Prefect's runs and the run's health (flow_runs, run_health), windows, slots,
  notifications, approvers, audit, the stores' target images by version (image_targets), the
  hypervisors' libvirt TLS CA (libvirt_tls), a store's link ridden out after step 5
  (store_link), staging's download window (download_window).

Steps stand side by side: a step module imports no other step module, and a client or a helper
imports no step module (nor a client another client); what two steps share lives in a client or
a helper. tests/structure/test_layers.py reads every import (nested ones too) and fails on one that
breaks this, or on a module of tasks/ that is in none of the three lists.
"""

STEP_MODULES = ("approvals", "data_export", "firstboot", "fleet_view", "go_live", "image_update",
                "observe",
                "preflight", "pxe_install", "reconcile_events", "refresh_box", "region_runs",
                "retire_box", "salt_master", "store_backup", "store_runs", "undo", "virt",
                "vm_removal", "box_move")
CLIENTS = ("backup", "bmc", "cobbler", "erp", "kiwi", "salt")
HELPERS = ("approvers", "audit", "blocks", "flow_runs", "image_delivery", "notifications",
           "retry", "root_password", "run_health", "slots", "store_vm", "transport", "vm_domain",
           "windows", "image_targets", "libvirt_tls", "store_link", "download_window",
           "outside_reads")

__all__ = ["CLIENTS", "HELPERS", "STEP_MODULES"]
