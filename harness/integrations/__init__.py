"""Adapters that run our objectives inside other RL frameworks (each needs its extra installed)."""
