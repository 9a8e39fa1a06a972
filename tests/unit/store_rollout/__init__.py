"""Tests of store_rollout/."""
