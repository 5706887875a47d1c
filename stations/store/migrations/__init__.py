"""Alembic migrations; ``stations serve`` upgrades to head on start."""
