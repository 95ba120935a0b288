"""Whole-system tests: official SDKs end to end, determinism properties, the policy table on the real backends, replicas, a database outage."""
