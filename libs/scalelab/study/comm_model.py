"""A ring all-reduce model of DDP scaling, fitted to a microbenchmark on the study's backend.

One ring all-reduce of S bytes over N workers moves 2(N-1)/N * S bytes per worker in 2(N-1)
messages: t(N, S) = 2(N-1)/N * S / B + 2(N-1) * alpha. Predicted step time at N workers is
compute + communication, assuming no overlap of the two (DDP overlaps them on GPUs, so there the
prediction is a lower bound on efficiency; on a CPU the two compete for the same cores).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Link:
    bandwidth_b_s: float  # bytes per second
    latency_s: float  # per message

    def allreduce_s(self, world_size: int, size_bytes: float) -> float:
        if world_size <= 1:
            return 0.0
        n = world_size
        return 2 * (n - 1) / n * size_bytes / self.bandwidth_b_s + 2 * (n - 1) * self.latency_s


def fit(world_size: int, sizes_bytes: list[float], times_s: list[float]) -> Link:
    """Least-squares fit of t = a + b * (2(N-1)/N * S) to measured all-reduce times."""
    n = world_size
    xs = [2 * (n - 1) / n * s for s in sizes_bytes]
    mean_x, mean_t = sum(xs) / len(xs), sum(times_s) / len(times_s)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (t - mean_t) for x, t in zip(xs, times_s)) / var if var else 0.0
    slope = max(slope, 1e-15)
    intercept = max(mean_t - slope * mean_x, 0.0)
    return Link(bandwidth_b_s=1.0 / slope, latency_s=intercept / (2 * (n - 1)))


def efficiency(compute_s: float, world_size: int, grad_bytes: float, link: Link) -> float:
    """Weak-scaling efficiency: per-rank compute unchanged, plus one gradient all-reduce."""
    return compute_s / (compute_s + link.allreduce_s(world_size, grad_bytes))


def strong_efficiency(compute_1_s: float, world_size: int, grad_bytes: float, link: Link) -> float:
    """Strong-scaling efficiency: the global batch's compute split N ways, plus the all-reduce."""
    per_rank = compute_1_s / world_size
    return per_rank / (per_rank + link.allreduce_s(world_size, grad_bytes))
