"""`scalelab reproduce`: rerun a tracked run from its recorded provenance (`run`) and compare the
params, metric histories and weights with the original (`compare`).

Owns: turning an MLflow run back into code, params and data, and the verdict. Runs the recorded
code as `scalelab train` in a separate worktree; imports tracking and runtime only.
"""
