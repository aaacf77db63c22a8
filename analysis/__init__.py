"""Offline analysis of run directories: load them (`load`), draw the papers' figures (`figures`), tabulate (`tables`).

`python -m analysis` (or `make figures`) does all of it for every run under outputs/ and multirun/.
"""

from analysis.load import RunSet, load_runs

__all__ = ["RunSet", "load_runs"]
