"""Training: workloads (`workloads`), the strategy wrapper (`strategy`), the step loop (`loop`),
LR schedules (`schedule`), the best value and early stopping (`best`), batches (`loader`), the
meter (`meter`), evaluation (`evaluation`), profiling (`profiling`), the run plan (`plan`), and
`scalelab train` with its SLURM job body (`submit`).

The job of one rank (`job`: process set-up, the MLflow run through `run_tracking`, and the job's
end with what it leaves in results/train, `outputs`) builds a `Trainer` (`trainer`), whose `fit()`
runs the step loop and, after each step, the callbacks that are due (`callbacks`: log, progress
bar, validate, best and early stop, prune, stop flag, checkpoint, profile). A new cadence is a
callback class in `callbacks` and one line in its `for_job`. What a checkpoint holds is the
trainer's registry of stateful parts (`checkpoint_parts`, registered in `trainer.register_parts`):
a new part is one `register` call. Where and how checkpoints are stored, found, moved aside and
checked is `checkpoint` (`checkpoint_files`, `checkpoint_checks`, `resume_from`).

Owns: everything between a validated config and trained weights. Imports launch, tracking, data,
config and runtime; never the study, bench, sweeps or the CLI.
"""
