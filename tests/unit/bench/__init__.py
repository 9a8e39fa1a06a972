"""Tests of bench/."""
