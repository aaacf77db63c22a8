"""Adapters that expose the objectives library to other RL frameworks (each imports its framework on demand)."""
