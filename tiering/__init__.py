"""Snapshots and events of the controller tiered into Delta tables (delta-rs)."""
