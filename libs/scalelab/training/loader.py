"""This rank's batches for an epoch, resumable at any step.

The order comes from DistributedSampler(seed) with set_epoch(epoch): one permutation per epoch
shared by all ranks, each taking its own slice (seeds are described in scalelab.runtime.seeds).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from scalelab.data.store import TensorPairs
from scalelab.runtime import dist, seeds
from scalelab.training.plan import RunPlan


def make_loader(
    x: torch.Tensor,
    y: torch.Tensor,
    plan: RunPlan,
    env: dist.DistEnv,
    *,
    seed: int,
    num_workers: int,
    epoch: int,
    skip_batches: int,
) -> DataLoader:
    """This rank's micro-batches of `epoch`, starting after `skip_batches` (the resume position)."""
    pairs = TensorPairs(x, y)
    sampler = DistributedSampler(
        pairs, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=seed, drop_last=True
    )
    sampler.set_epoch(epoch)
    order = list(sampler)
    size = plan.per_rank_batch
    batches = [order[i : i + size] for i in range(0, plan.steps_per_epoch * plan.grad_accum_steps * size, size)]
    return DataLoader(
        pairs,
        batch_sampler=batches[skip_batches:],
        collate_fn=_identity,
        num_workers=num_workers,
        worker_init_fn=_WorkerSeed(seed, env.rank),
        # its own generator: making an iterator must not draw from the global RNG,
        # or a resumed epoch would shift every later dropout mask
        generator=torch.Generator().manual_seed(seeds.rank_seed(seed, env.rank)),
    )


def _identity(batch: Any) -> Any:
    return batch


class _WorkerSeed:
    """worker_init_fn: seeds worker w of rank r with seeds.worker_seed(base, r, w)."""

    def __init__(self, base: int, rank: int) -> None:
        self.base, self.rank = base, rank

    def __call__(self, worker: int) -> None:
        seeds.seed_all(seeds.worker_seed(self.base, self.rank, worker))
