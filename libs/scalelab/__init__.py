"""scalelab: reproducible multi-GPU training studies with DVC, submitit/SLURM and MLflow."""

__version__ = "0.1.0"
