"""Timed repeats: the one loop that the study's cells and the benchmarks time with.

Each repeat times `steps` calls of every arm on this rank. A block of calls starts after a
barrier (every rank starts together) and a device sync (nothing queued before it counts), and
its last call ends with a device sync (everything it queued counts). With several arms, the arms
are interleaved so that machine noise hits them alike:

- `interleave="repeat"`: all steps of one arm, then all steps of the next; the order reverses
  every other repeat (a, b, b, a, ...);
- `interleave="step"`: one step of each arm, each after its own barrier; the order reverses
  every step and every repeat.

`slowest_rank` turns every rank's per-repeat figures into the pace of the job: for each repeat,
the largest over the ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import torch

from scalelab.runtime import dist

INTERLEAVE = ("repeat", "step")


def sync(device: torch.device | None) -> None:
    """Waits for the work queued on a CUDA device; nothing to wait for elsewhere."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _order(names: list[str], turn: int) -> list[str]:
    return names if turn % 2 == 0 else names[::-1]


def _block(step: Callable[[int], object], indices: Sequence[int], device: torch.device | None) -> list[float]:
    """Seconds of each call `step(i)`, after a barrier and a sync; the last one includes the final sync."""
    dist.barrier()
    sync(device)
    marks = [time.perf_counter()]
    for i in indices:
        step(i)
        marks.append(time.perf_counter())
    sync(device)
    marks[-1] = time.perf_counter()
    return [end - start for start, end in zip(marks, marks[1:])]


def timed_repeats(
    arms: Mapping[str, Callable[[int], object]],
    *,
    repeats: int,
    steps: int,
    device: torch.device | None = None,
    interleave: str = "repeat",
) -> dict[str, list[list[float]]]:
    """Times `repeats` x `steps` calls of every arm on this rank, interleaved.

    Args:
        arms: name -> the call to time; it gets the step index within the repeat (0..steps-1).
        repeats: how many repeats.
        steps: calls per arm and repeat.
        device: synced around each block (CUDA); None or a CPU device: no sync.
        interleave: "repeat" (arms take turns by blocks of `steps`) or "step" (step by step).

    Returns:
        arm -> repeat -> seconds of each call, on this rank (a repeat's time is their sum).
    """
    if interleave not in INTERLEAVE:
        raise ValueError(f"interleave = {interleave!r}: choose one of {', '.join(INTERLEAVE)}")
    names = list(arms)
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    for rep in range(repeats):
        if interleave == "repeat":
            for name in _order(names, rep):
                times[name].append(_block(arms[name], range(steps), device))
            continue
        spent: dict[str, list[float]] = {name: [] for name in names}
        for i in range(steps):
            for name in _order(names, rep + i):
                spent[name] += _block(arms[name], [i], device)
        for name in names:
            times[name].append(spent[name])
    return times


def repeat_totals(times: list[list[float]]) -> list[float]:
    """Each repeat's time: the sum of its calls' seconds."""
    return [sum(calls) for calls in times]


def slowest_rank(per_repeat: list[float]) -> list[float]:
    """For each repeat, the largest figure over all ranks (a collective: every rank calls it)."""
    return [max(ranks) for ranks in zip(*dist.all_gather_object(per_repeat))]
