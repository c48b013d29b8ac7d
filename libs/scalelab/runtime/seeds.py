"""Seeds: one base seed in params, and a documented derivation for every rank and worker.

- Model initialisation uses the base seed itself, on every rank, so that all ranks start from the
  same weights (DDP would broadcast rank 0's anyway; this makes single and DDP runs comparable).
- After that, rank r draws from `rank_seed(base, r)` = the first 32-bit word of
  `numpy.random.SeedSequence(base, spawn_key=(r,))`: independent streams for dropout and the like.
- DataLoader worker w of rank r uses `worker_seed(base, r, w)`, with spawn_key=(r, w).
- The data order comes from DistributedSampler(seed=base) with set_epoch(epoch): a permutation per
  epoch shared by all ranks, each taking its own slice.
"""

from __future__ import annotations

import random

import numpy as np
import torch

RANK_RULE = "numpy.random.SeedSequence(base, spawn_key=(rank,)).generate_state(1)[0]"
WORKER_RULE = "numpy.random.SeedSequence(base, spawn_key=(rank, worker)).generate_state(1)[0]"


def rank_seed(base: int, rank: int) -> int:
    return int(np.random.SeedSequence(base, spawn_key=(rank,)).generate_state(1)[0])


def worker_seed(base: int, rank: int, worker: int) -> int:
    return int(np.random.SeedSequence(base, spawn_key=(rank, worker)).generate_state(1)[0])


def seed_all(seed: int) -> None:
    """Seeds Python, NumPy and torch (CPU and CUDA) with one value."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def ledger(base: int, world_size: int, num_workers: int, deterministic: bool) -> dict:
    """Every seed this job uses, for MLflow and for reproducing it."""
    return {
        "base_seed": base,
        "model_init_seed": base,
        "rank_seed_rule": RANK_RULE,
        "rank_seeds": {str(r): rank_seed(base, r) for r in range(world_size)},
        "worker_seed_rule": WORKER_RULE,
        "num_workers": num_workers,
        "worker_seeds": {f"{r}.{w}": worker_seed(base, r, w) for r in range(world_size) for w in range(num_workers)},
        "sampler": "DistributedSampler(seed=base_seed).set_epoch(epoch)",
        "deterministic_algorithms": deterministic,
    }


def ledger_params(ledger_: dict) -> dict[str, object]:
    """The ledger as flat MLflow params: seed.base, seed.rank.N, the rules and the flags."""
    return {
        "seed.base": ledger_["base_seed"],
        "seed.model_init": ledger_["model_init_seed"],
        **{f"seed.rank.{r}": s for r, s in ledger_["rank_seeds"].items()},
        "seed.rank_rule": ledger_["rank_seed_rule"],
        "seed.worker_rule": ledger_["worker_seed_rule"],
        "seed.num_workers": ledger_["num_workers"],
        "seed.sampler": ledger_["sampler"],
        "seed.deterministic": ledger_["deterministic_algorithms"],
    }


def rng_state() -> dict:
    """Every generator's state as tensors and plain values, so that checkpoints load with
    `torch.load(weights_only=True)`: nothing in them is a pickled object."""
    version, keys, gauss = random.getstate()
    _, np_keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "python": [version, list(keys), gauss],
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    if torch.cuda.is_available():  # this rank's GPU only: a resume may see fewer GPUs
        state["cuda_device"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if not torch.cuda.is_available():
        return
    if "cuda_device" in state:
        torch.cuda.set_rng_state(state["cuda_device"])
    elif "cuda" in state:  # an older checkpoint: every GPU that was visible; this rank's, if it is there
        index = torch.cuda.current_device()
        if index < len(state["cuda"]):
            torch.cuda.set_rng_state(state["cuda"][index])
