"""Tests of the Salt tree (salt_states/): its modules, states, engines, reactor and renders."""
