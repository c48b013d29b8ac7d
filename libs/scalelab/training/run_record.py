"""What a training job's MLflow run records: its name, every param (masked), the seed ledger,
the provenance and the resolved config (`config.json`, which `scalelab reproduce` rebuilds from).
Global rank 0 calls these once the run is open (`training.run_tracking.open_tracker`)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from scalelab.config import Params, flatten, to_dict
from scalelab.data.store import read_manifest, recorded_hashes
from scalelab.runtime import dist, seeds
from scalelab.runtime.paths import repo_root
from scalelab.tracking import Tracker, provenance
from scalelab.tracking.secrets import mask_params

log = logging.getLogger(__name__)
NAMED_KEYS = ("train.strategy", "train.nproc_per_node", "train.num_nodes", "train.precision", "train.seed")


def run_name(params: Params, world_size: int, max_keys: int = 3) -> str:
    """`ddp-w2-fp32-seed0`, then what tells this run apart: the DVC experiment's name when DVC runs
    one, else the params that differ from the committed params.yaml (`-lr0.002`; at most
    `max_keys`, then `+N`)."""
    t = params.train
    name = f"{t.strategy}-w{world_size}-{t.precision}-seed{t.seed}"
    if exp := os.environ.get("DVC_EXP_NAME"):
        return f"{name}-{exp}"
    changed = {k: v for k, v in provenance.params_changes(repo_root(), to_dict(params)).items() if k not in NAMED_KEYS}
    parts = [f"{k.rsplit('.', 1)[-1]}{str(v).replace(' ', '')}" for k, v in list(changed.items())[:max_keys]]
    more = f"+{len(changed) - max_keys}" if len(changed) > max_keys else ""
    return "-".join([name, *parts]) + more


def log_run_inputs(
    tracker: Tracker, params: Params, env: dist.DistEnv, nodes: list[dict[str, str]], data_dir: str | Path
) -> None:
    """Params of every stage, the seed ledger, provenance and the resolved config."""
    stages = {k: v for k, v in to_dict(params).items() if k != "speedup"}
    ledger = seeds.ledger(params.train.seed, env.world_size, params.train.num_workers, params.train.deterministic)
    logged = {**flatten(mask_params(stages)), **seeds.ledger_params(ledger), "world_size": env.world_size}
    tracker.log_params(logged)  # no credential reaches the store (sweep.storage's password, a token)
    consumed = {"train": to_dict(params.train), "tracking": to_dict(params.tracking)}  # dvc.yaml: train
    known = recorded_hashes(read_manifest(data_dir))  # hashed by prepare; a 10 GB split is not read again
    tags, artifacts = provenance.collect(
        repo_root(),
        data_dir=data_dir,
        nodes=nodes,
        params_sections=consumed,
        data_hashes=known,
        untracked_contents=params.tracking.upload_untracked,
    )
    if tags.get("scalelab.not_reproducible"):  # one line at the job's start, naming file and line
        log.warning("run %s will not be reproducible: %s", tracker.run_id, tags["scalelab.not_reproducible"])
    tracker.set_tags(tags)
    tracker.log_dict(ledger, "seeds.json")
    log_config(tracker, params)
    for name, text in artifacts.items():
        tracker.log_text(text, name)


def log_resumed_params(tracker: Tracker, params: Params) -> None:
    """A resume may change keys that cannot change the weights (cadence, tracking, profiling: the
    checkpoint fingerprint leaves them out). MLflow params cannot change, so the new values go to
    `resumed.<key>` tags and a new `config.json`."""
    logged = tracker.client.get_run(tracker.run_id).data.params
    stages = mask_params({k: v for k, v in to_dict(params).items() if k != "speedup"})
    now = {k: str(v) for k, v in flatten(stages).items()}
    changed = {f"resumed.{k}": v for k, v in now.items() if k in logged and logged[k] != v}
    if changed:
        log.info("resuming run %s with %s", tracker.run_id, ", ".join(f"{k[8:]}={v}" for k, v in changed.items()))
        tracker.set_tags(changed)
        log_config(tracker, params)


def log_config(tracker: Tracker, params: Params) -> None:
    """The resolved params as `config.json` (masked as the params are), with its sha256 as a tag:
    `scalelab reproduce` builds its params.yaml from it and checks it first."""
    text = json.dumps(mask_params(to_dict(params)), indent=2, sort_keys=True, default=str)
    tracker.set_tags({"provenance.config.sha256": hashlib.sha256(text.encode()).hexdigest()})
    tracker.log_text(text, "config.json")
