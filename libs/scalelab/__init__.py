"""scalelab: reproducible multi-GPU training studies with DVC, submitit/SLURM and MLflow."""
