"""Maintenance tools for the course repository: executing notebooks, hygiene checks, student copies."""
