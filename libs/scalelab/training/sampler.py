"""The order of an epoch: a seeded permutation computed position by position, and this rank's batches.

`Permutation(n, seed, epoch)` maps a position of the epoch to a sample index. It is a keyed
bijection of range(n) (a balanced Feistel network over the smallest even number of bits covering
n, with cycle walking back into range), so the order is fixed by (seed, epoch) alone and no list
of n indices ever exists: a batch's indices are computed from its positions, in O(batch) memory.

`RankBatches` deals the epoch as DistributedSampler(drop_last=True) does: rank r of W takes the
positions r, r + W, r + 2W, ... in micro-batches of B, so at every step the W ranks' batches
together are exactly one process's batch of W x B. `set_epoch(epoch, skip_batches)` starts the
next pass `skip_batches` micro-batches in (a resumed job), computing none of those skipped. The
indices are computed BLOCK_POSITIONS at a time (about 0.1 us each), so memory stays O(1) in n.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

ROUNDS = 6
BLOCK_POSITIONS = 1 << 14  # positions computed per numpy call: 128 KiB of indices, whatever n
_GOLDEN, _M1, _M2 = (np.uint64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijective 64-bit mixer (arithmetic wraps modulo 2**64)."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class Permutation:
    """A pseudo-random permutation of range(n), keyed by (seed, epoch); call it on positions."""

    def __init__(self, n: int, seed: int, epoch: int) -> None:
        bits = max(int(n - 1).bit_length(), 2)
        self.half = np.uint64((bits + 1) // 2)
        self.mask = np.uint64((1 << int(self.half)) - 1)
        self.n = n
        rng = np.random.default_rng([seed, epoch])
        self.keys = rng.integers(0, 2**64 - 1, size=ROUNDS, dtype=np.uint64, endpoint=True)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & self.mask)
        return (left << self.half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The sample index at each position (int64), each in range(n)."""
        x = self._encrypt(np.asarray(positions, dtype=np.uint64))
        out = x >= self.n
        while out.any():  # cycle walking: the domain is < 4n, so a few rounds at most on average
            x[out] = self._encrypt(x[out])
            out = x >= self.n
        return x.astype(np.int64)


class RankBatches(torch.utils.data.Sampler):
    """This rank's micro-batches of one epoch, as index arrays (a DataLoader `batch_sampler`)."""

    def __init__(
        self, num_samples: int, *, world_size: int, rank: int, batch_size: int, num_batches: int, seed: int
    ) -> None:
        if num_batches * batch_size * world_size > num_samples:
            raise ValueError(f"{num_batches} batches of {batch_size} x {world_size} ranks exceed {num_samples} samples")
        self.num_samples, self.world_size, self.rank = num_samples, world_size, rank
        self.batch_size, self.num_batches, self.seed = batch_size, num_batches, seed
        self.epoch, self.skip_batches = 0, 0

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """The next pass yields `epoch`'s micro-batches from number `skip_batches` on."""
        self.epoch, self.skip_batches = epoch, skip_batches

    def __len__(self) -> int:
        return self.num_batches - self.skip_batches

    def batches(self, permutation: Permutation, first: int, count: int) -> np.ndarray:
        """Micro-batches first .. first + count - 1 of this rank, as a (count, batch) array."""
        local = np.arange(first * self.batch_size, (first + count) * self.batch_size, dtype=np.uint64)
        indices = permutation(local * np.uint64(self.world_size) + np.uint64(self.rank))
        return indices.reshape(count, self.batch_size)

    def __iter__(self) -> Iterator[np.ndarray]:
        permutation = Permutation(self.num_samples, self.seed, self.epoch)
        per_block = max(BLOCK_POSITIONS // self.batch_size, 1)  # computed a block at a time: numpy's
        for first in range(self.skip_batches, self.num_batches, per_block):  # per-call cost amortised
            yield from self.batches(permutation, first, min(per_block, self.num_batches - first))
