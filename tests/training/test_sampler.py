"""The sampler that scales: every sample once per epoch, an order fixed by (seed, epoch), the ranks'
batches of a step together equal to one process's batch, O(batch) memory, and a resume that
fetches none of the batches it skips."""

import tracemalloc

import numpy as np
import pytest
import torch

from scalelab.data.store import FeatureSplit
from scalelab.runtime.dist import DistEnv
from scalelab.training.loader import RunLoader
from scalelab.training.plan import RunPlan
from scalelab.training.sampler import Permutation, RankBatches


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 65_537])
def test_the_permutation_is_a_bijection_fixed_by_seed_and_epoch(n):
    order = Permutation(n, seed=0, epoch=0)(np.arange(n))
    assert sorted(order.tolist()) == list(range(n))
    assert np.array_equal(order, Permutation(n, seed=0, epoch=0)(np.arange(n)))
    if n >= 64:  # 64! orders: two keys meeting the same one is never
        assert not np.array_equal(order, Permutation(n, seed=0, epoch=1)(np.arange(n)))
        assert not np.array_equal(order, Permutation(n, seed=1, epoch=0)(np.arange(n)))
        assert abs(np.corrcoef(np.arange(n), order)[0, 1]) < 0.2  # shuffled, not shifted


def rank_batches(n, world, rank, batch=4, **kw):
    sampler = RankBatches(n, world_size=world, rank=rank, batch_size=batch, num_batches=n // (world * batch), seed=5)
    sampler.set_epoch(kw.get("epoch", 0), kw.get("skip", 0))
    return list(sampler)


def test_the_ranks_share_each_step_exactly_as_one_process_would_take_it():
    single = rank_batches(103, world=1, rank=0, batch=8)
    ranks = [rank_batches(103, world=2, rank=r, batch=4) for r in (0, 1)]
    assert len(single) == len(ranks[0]) == len(ranks[1]) == 12  # drop_last: 12 x 8 of 103
    for step, whole in enumerate(single):
        a, b = ranks[0][step], ranks[1][step]
        assert not set(a) & set(b)
        assert sorted([*a, *b]) == sorted(whole)  # the same samples in the same step
    seen = np.concatenate(single)
    assert len(set(seen.tolist())) == len(seen) == 96


def test_a_resumed_pass_yields_the_tail_of_the_same_epoch():
    full = rank_batches(200, world=2, rank=1, epoch=3)
    tail = rank_batches(200, world=2, rank=1, epoch=3, skip=7)
    assert len(tail) == len(full) - 7 and all(np.array_equal(a, b) for a, b in zip(full[7:], tail))


def test_memory_is_that_of_a_batch_even_for_a_billion_samples():
    sampler = RankBatches(10**9, world_size=8, rank=3, batch_size=64, num_batches=10**9 // 512, seed=0)
    sampler.set_epoch(2, skip_batches=10**6)  # deep into the epoch: nothing before is computed
    tracemalloc.start()
    batches = iter(sampler)
    got = [next(batches) for _ in range(3)]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak} bytes for 3 batches of 64 of a billion"  # a list of its indices: 8 GB
    assert all(len(b) == 64 and b.max() < 10**9 for b in got)


class CountingSplit(FeatureSplit):
    """A split in memory that records every index it fetches."""

    def __init__(self, n):
        x, y = np.arange(n, dtype=np.float32)[:, None], np.arange(n) % 2
        super().__init__(None, {"num_samples": n})
        self._arrays = {"x": x, "y": y}
        self.fetched = []

    def fetch_arrays(self, indices):
        self.fetched.extend(np.asarray(indices).tolist())
        return super().fetch_arrays(indices)


def plan(n, batch=5, world=2):
    steps = n // (batch * world)
    return RunPlan(
        world_size=world,
        per_rank_batch=batch,
        grad_accum_steps=1,
        global_batch=batch * world,
        steps_per_epoch=steps,
        total_steps=3 * steps,
    )


def test_resuming_at_step_k_fetches_none_of_the_skipped_batches():
    split = CountingSplit(300)
    loader = RunLoader(split, plan(300), DistEnv(rank=1, world_size=2), seed=0, num_workers=0)
    everything = [x[:, 0].long() for x, _ in loader.epoch(1)]
    split.fetched.clear()
    resumed = [x[:, 0].long() for x, _ in loader.epoch(1, skip_batches=17)]
    assert split.fetched == torch.cat(resumed).tolist()  # only what it yields
    assert len(resumed) == 30 - 17 and all(torch.equal(a, b) for a, b in zip(everything[17:], resumed))


def test_persistent_workers_give_the_same_batches_as_the_main_process():
    split = CountingSplit(300)
    inline = RunLoader(split, plan(300), DistEnv(rank=0, world_size=2), seed=0, num_workers=0)
    workers = RunLoader(split, plan(300), DistEnv(rank=0, world_size=2), seed=0, num_workers=2)
    try:
        for epoch, skip in ((0, 0), (1, 0), (2, 9)):  # one DataLoader, its workers kept across epochs
            first = workers.loader._iterator
            a = [x for x, _ in inline.epoch(epoch, skip)]
            b = [x for x, _ in workers.epoch(epoch, skip)]
            assert len(a) == len(b) == 30 - skip and all(torch.equal(p, q) for p, q in zip(a, b))
            assert first is None or workers.loader._iterator is first  # the same workers, not new ones
    finally:
        workers.close()
