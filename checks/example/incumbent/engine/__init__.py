"""The example engine."""
