"""Tests that need the running lab (module-level mark `lab`, `full_lab` or `scale`; a module with a few
lab-free tests sits here when the lab is its main subject)."""
