"""Electra package."""
