"""Launching: worker processes on this machine (`local`: torchrun, and the spec.json -> ranks ->
out.json protocol of the study's cells and the benchmarks), SLURM through submitit
(`slurm`: profiles, pre-flight, executors, waiting) and the one job-shape check (`shape`).

Owns: processes, nodes, tasks and the cluster. Never imports what it launches (training, the
study): job bodies live beside the stages they run and reach this package as callables or as
`scalelab` worker commands. Imports tracking (the store's URI), config and runtime.
"""
