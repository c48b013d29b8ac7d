"""The lab's shared store: one place for DVC's outputs, MLflow's artifacts and checkpoints.

Owns: which store this clone uses (read from DVC's config), reaching it (fsspec/s3fs with the
store's endpoint and credentials), checking it answers, and the local S3 server (rclone).

The store is DVC's default remote (`scalelab store set URL`, or `dvc remote add -d`): an S3 URL
(`s3://bucket/prefix`, with an endpoint for MinIO, Ceph, Garage or a local `rclone serve s3`) or a
folder on a shared filesystem. Everything else derives from it: DVC keeps its objects under
`<url>/files/`, the MLflow server its artifacts under `<url>/mlflow-artifacts`, and jobs their
checkpoints under `<url>/checkpoints` (`train.checkpoint_dir: store`). Credentials live in
`.dvc/config.local` (0600, ignored by git) or the environment, never in git, params or MLflow.
Only the clients a real S3 needs are used (s3fs/botocore, as dvc-s3 does), so the same code runs
against AWS and any S3-compatible server.
"""

from scalelab.storage.store import (
    CHECKPOINTS,
    MLFLOW_ARTIFACTS,
    Store,
    StoreError,
    configured,
    filesystem,
    is_url,
    write_remote,
)

__all__ = [
    "CHECKPOINTS",
    "MLFLOW_ARTIFACTS",
    "Store",
    "StoreError",
    "configured",
    "filesystem",
    "is_url",
    "write_remote",
]
