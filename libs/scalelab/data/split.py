"""Train/val/test assignment in a stream: exact sizes, seeded, in constant memory.

The items (feature rows, or documents) are read once, in source order, and each goes to one split
as it passes. `Splitter` hands out the labels: the counts of each split are exact (`split_sizes`),
every arrangement of the labels is equally likely, and the labels come from `seed` alone, block by
block (`BLOCK` items, each block drawing its share of each split from a multivariate
hypergeometric, then shuffling it), so they do not depend on how the reader chunks its input and
no permutation of every item is ever held.
"""

from __future__ import annotations

import numpy as np

SPLITS = ("train", "val", "test")
TRAIN, VAL, TEST = range(3)
BLOCK = 1 << 16


def split_sizes(n: int, val_fraction: float, test_fraction: float) -> dict[str, int]:
    """Items per split: at least one in val and test, the rest in train (which may be empty)."""
    n_test, n_val = max(1, round(n * test_fraction)), max(1, round(n * val_fraction))
    return {"train": max(n - n_test - n_val, 0), "val": n_val, "test": n_test}


class Splitter:
    """Labels (TRAIN, VAL, TEST) for items taken in order; `take(k)` returns the next k."""

    def __init__(self, sizes: dict[str, int], seed: int) -> None:
        self.remaining = np.array([sizes[name] for name in SPLITS], dtype=np.int64)
        self.seed = seed
        self._block = 0
        self._buffer = np.empty(0, dtype=np.int8)

    def _next_block(self) -> np.ndarray:
        size = int(min(BLOCK, self.remaining.sum()))
        if size == 0:
            raise ValueError("Splitter: more items taken than were counted")
        rng = np.random.default_rng([self.seed, self._block])
        counts = rng.multivariate_hypergeometric(self.remaining, size)
        self.remaining -= counts
        self._block += 1
        labels = np.repeat(np.arange(3, dtype=np.int8), counts)
        rng.shuffle(labels)
        return labels

    def take(self, k: int) -> np.ndarray:
        """The labels of the next `k` items (int8)."""
        parts, have = [self._buffer], len(self._buffer)
        while have < k:
            parts.append(self._next_block())
            have += len(parts[-1])
        labels = np.concatenate(parts)
        self._buffer = labels[k:]
        return labels[:k]
