"""This rank's batches, one DataLoader for the whole run, resumable at any step.

The order comes from training.sampler (one seeded permutation per epoch shared by all ranks, each
taking its own positions; seeds are described in scalelab.runtime.seeds). The DataLoader is made
once: its workers (`num_workers` > 0) persist across epochs, and `epoch(e, skip_batches)` sets the
sampler's epoch and resume position before each pass. A worker fetches a whole micro-batch with one
memory-mapped gather (`Split.fetch_arrays`) and sends it as NumPy arrays; the rank makes the tensors
(`Split.to_tensors`), without torch's per-tensor shared-memory handles.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from scalelab.data.store import Split
from scalelab.runtime import dist, seeds
from scalelab.training.plan import RunPlan
from scalelab.training.sampler import RankBatches


class RunLoader:
    """The run's DataLoader over `split` and its sampler; close() ends its workers."""

    def __init__(self, split: Split, plan: RunPlan, env: dist.DistEnv, *, seed: int, num_workers: int) -> None:
        self.split = split
        self.sampler = RankBatches(
            len(split),
            world_size=env.world_size,
            rank=env.rank,
            batch_size=plan.per_rank_batch,
            num_batches=plan.steps_per_epoch * plan.grad_accum_steps,
            seed=seed,
        )
        self.loader = DataLoader(
            split,
            batch_sampler=self.sampler,
            collate_fn=_identity,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            worker_init_fn=_WorkerSeed(seed, env.rank),
            # its own generator: making an iterator must not draw from the global RNG,
            # or a resumed epoch would shift every later dropout mask
            generator=torch.Generator().manual_seed(seeds.rank_seed(seed, env.rank)),
        )

    def epoch(self, epoch: int, skip_batches: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches of `epoch`, starting after `skip_batches` (the resume position)."""
        self.sampler.set_epoch(epoch, skip_batches)
        return map(self.split.to_tensors, iter(self.loader))

    def close(self) -> None:
        """Ends the persistent workers now rather than at garbage collection."""
        workers = getattr(self.loader, "_iterator", None)
        if workers is not None and hasattr(workers, "_shutdown_workers"):
            workers._shutdown_workers()
        self.loader._iterator = None


def _identity(batch: Any) -> Any:
    return batch


class _WorkerSeed:
    """worker_init_fn: seeds worker w of rank r with seeds.worker_seed(base, r, w)."""

    def __init__(self, base: int, rank: int) -> None:
        self.base, self.rank = base, rank

    def __call__(self, worker: int) -> None:
        seeds.seed_all(seeds.worker_seed(self.base, self.rank, worker))
