"""Training: workloads (`workloads`), the strategy wrapper (`strategy`), the step loop (`loop`),
LR schedules (`schedule`), the best value and early stopping (`best`), batches (`loader`), the
meter (`meter`), checkpoints (`checkpoint`), evaluation (`evaluation`), profiling (`profiling`),
the run plan (`plan`), the per-rank train job (`job`) and what it leaves in results/train
(`outputs`), `scalelab train` with its SLURM job body (`submit`) and sweeps (`sweep`).

Owns: everything between a validated config and trained weights. Imports launch, tracking, data,
config and runtime; never the study, bench or the CLI.
"""
