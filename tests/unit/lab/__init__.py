"""Tests of the lab's own modules (lab/) that need no running lab."""
