"""The fleet tier (module-level mark `fleet`, `make test-fleet`): minutes-long waits in the lab, opt-in."""
