"""The run directory's format, below both the trainer that writes it and the analysis that reads it: its files
(atomic writes, JSONL), its lock, its config record and how two records differ, and the W&B settings."""
