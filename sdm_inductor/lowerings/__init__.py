"""Inductor lowerings for the sdm ops (issue 4)."""
