"""Tests of one package each: tests/unit/<package>/ mirrors the code's top-level folders
(store_rollout, tasks, app, lab, salt_states, bench). No running lab, but for the odd lab test of a
module whose main subject is the package (tests/README.md)."""
