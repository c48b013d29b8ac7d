"""Sweeps: many training runs of one pipeline, as a SLURM job array or processes here.

Owns: `scalelab sweep` (sweep.py: a grid of -S overrides, status, collect), searches with Optuna
(search.py submits, search_worker.py runs trials, search_collect.py gathers them), how points are
picked (samplers.py: the one grid, and Optuna's samplers by `--method`), the manifest
every part reads (manifest.py) and the summary tables (sweep_table.py). It sits above training,
which it drives, and no DVC stage depends on it: editing a sweep retrains nothing. The trial side
of pruning (training.pruning) is the job's own, below.
"""
