"""What a checkpoint holds: a registry of the job's stateful parts, `{name: part}`.

A part is any object with `state()` (what goes into the checkpoint, under its name) and
`load(state)` (puts it back). Every rank calls `CheckpointParts.state()` at the same step, in the
same order of parts: a part may gather from every rank (the RNG states, the meter windows). The
checkpoint is `{name: part.state()}`, plus the step and the fingerprint that `Checkpointer.save`
adds; under fsdp the model and optimizer shards go apart, each rank writing its own (`shards()`).

The train job's parts (`training.trainer.register_parts`): `weights` (model and optimizer, through
the strategy), the loop's own stateful fields (`Loop.stateful()`: scaler, LR schedule), `counters`
(step, epoch and sampler position), `meter_window` (every rank's open logging window),
`pending_metrics` (those MLflow has not confirmed), `best`, and `rng` (every rank's random
state). A new part is one `register` call; a test fails when a stateful field of the loop is left out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from scalelab.runtime import dist, seeds
from scalelab.storage import Store
from scalelab.training.checkpoint_files import STORE_KEY, CheckpointError, files_at, metadata_refusal
from scalelab.training.loop import Loop

log = logging.getLogger(__name__)
RESERVED = ("step", "fingerprint", "shards", STORE_KEY)  # entries Checkpointer.save or the load adds
WINDOW_KEY = "meter_window"  # every rank's open logging window (training.meter)
PENDING_KEY = "pending_metrics"  # metrics not yet confirmed stored in MLflow


class Part(Protocol):
    def state(self) -> Any: ...  # every rank calls it; may be a collective
    def load(self, state: Any) -> None: ...


class CheckpointParts:
    """`{name: part}`, in registration order: what a checkpoint holds and what a resume restores."""

    def __init__(self) -> None:
        self.parts: dict[str, Part] = {}

    def register(self, name: str, part: Part) -> None:
        if name in self.parts or name in RESERVED:
            raise ValueError(f"checkpoint part {name!r}: the name is taken (parts: {', '.join(self.parts)})")
        self.parts[name] = part

    def state(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """(the state, complete on global rank 0; this rank's shards under fsdp, else None).
        Every rank calls it."""
        state = {name: part.state() for name, part in self.parts.items()}
        shards = [part.shards() for part in self.parts.values() if hasattr(part, "shards")]
        return state, next((s for s in shards if s is not None), None)

    def load(self, checkpoint: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
        """Restores every part from a loaded checkpoint (a sharded one: its shards too).

        Raises:
            CheckpointError: the checkpoint lacks a registered part.
        """
        if "parts" in checkpoint and "weights" not in checkpoint:  # saved before parts were registered
            checkpoint = older_layout(checkpoint)
        missing = [name for name in self.parts if name not in checkpoint and name not in skip]
        if missing:
            raise CheckpointError(f"the checkpoint of step {checkpoint.get('step')} holds no {', '.join(missing)}")
        for name, part in self.parts.items():
            if name not in skip:
                entry = checkpoint[name]
                if isinstance(part, Weights) and "shards" in checkpoint:  # where its shards are
                    entry = {"shards": checkpoint["shards"], "store": checkpoint.get(STORE_KEY)}
                part.load(entry)


class StateDict:
    """A part that has `state_dict()` and `load_state_dict()` (scaler, LR schedule, best value)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def state(self) -> Any:
        return self.obj.state_dict()

    def load(self, state: Any) -> None:
        self.obj.load_state_dict(state)


class Weights:
    """Model and optimizer, through the strategy: their full state dicts under ddp and single;
    under fsdp each rank's shards (`shards()`, written with DCP; nothing is gathered)."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def state(self) -> dict[str, Any] | None:
        loop = self.loop
        return None if loop.strategy.sharded else loop.strategy.full_state(loop.model, loop.optimizer)

    def shards(self) -> dict[str, Any] | None:
        loop = self.loop
        return loop.strategy.sharded_state(loop.model, loop.optimizer) if loop.strategy.sharded else None

    def load(self, state: dict[str, Any]) -> None:
        model, optimizer, chosen = self.loop.model, self.loop.optimizer, self.loop.strategy
        if "shards" in state:
            chosen.load_sharded_state(
                model, optimizer, lambda target: read_shards(state["shards"], target, state["store"])
            )
        else:
            chosen.load_full_state(model, optimizer, state)


class Counters:
    """The loop counters: optimizer steps done, read and set through `get` and `set`. The epoch
    and the sampler's position follow from the step (recorded for readers)."""

    def __init__(self, get: Callable[[], int], set: Callable[[int], None], steps_per_epoch: int = 0) -> None:
        self.get, self.set, self.steps_per_epoch = get, set, steps_per_epoch

    def state(self) -> dict[str, int]:
        step, per_epoch = self.get(), self.steps_per_epoch
        return {"step": step, **({"epoch": step // per_epoch, "step_in_epoch": step % per_epoch} if per_epoch else {})}

    def load(self, state: dict[str, int]) -> None:
        self.set(int(state["step"]))


class Rng:
    """Every rank's random state (gathered to rank 0). At another world size (same global batch)
    each rank's streams start anew from (seed, step): they do not map onto a new number of ranks."""

    def __init__(self, seed: int, env: dist.DistEnv, step: Callable[[], int]) -> None:
        self.seed, self.env, self.step = seed, env, step

    def state(self) -> list[Any]:
        return dist.all_gather_object(seeds.rng_state())

    def load(self, state: list[Any]) -> None:
        if len(state) == self.env.world_size:
            seeds.set_rng_state(state[self.env.rank])
            return
        log.warning(
            "resuming step %d, saved by %d ranks, on %d: the same data order; each rank's random "
            "streams (dropout) start anew from the seed and the step",
            self.step(),
            len(state),
            self.env.world_size,
        )
        seeds.seed_all(seeds.rank_seed(self.seed + self.step(), self.env.rank))


class MeterWindow:
    """Every rank's open logging window (`Meter.window_state`); at another world size, none."""

    def __init__(self, meter: Any, env: dist.DistEnv, device: Any) -> None:
        self.meter, self.env, self.device = meter, env, device

    def state(self) -> list[Any]:
        return dist.all_gather_object(self.meter.window_state())

    def load(self, state: list[Any]) -> None:
        self.meter.load_window(state[self.env.rank] if len(state) == self.env.world_size else None, self.device)


class PendingMetrics:
    """The metrics the tracker has not yet confirmed stored. `state()` first hands the buffered
    ones to the background writer without waiting; a resume sends the saved ones again, so none is
    lost and none is logged twice (SQL stores drop exact duplicates)."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker

    def state(self) -> list[Any]:
        self.tracker.flush(wait=False)
        return self.tracker.pending_metrics()

    def load(self, state: list[Any]) -> None:
        self.tracker.replay_metrics(state)


def loop_parts(
    loop: Loop, seed: int, env: dist.DistEnv, step: Callable[[], int], extra: dict[str, Any] | None = None
) -> CheckpointParts:
    """The parts of a bare loop: weights, its stateful fields, `extra` (objects with a
    `state_dict()`) and the RNG: what the benchmarks and the tests save."""
    parts = CheckpointParts()
    parts.register("weights", Weights(loop))
    for name, field in {**loop.stateful(), **(extra or {})}.items():
        parts.register(name, StateDict(field))
    parts.register("rng", Rng(seed, env, step))
    return parts


def checkpoint_state(
    loop: Loop, epoch: int, run_id: str | None, parts: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`loop_parts(...).state()` of a bare loop, with its epoch and run id; every rank calls it."""
    state, shards = loop_parts(loop, 0, dist.read_env(), lambda: 0, parts).state()
    return {**state, "epoch": epoch, "run_id": run_id}, shards


def restore(state: dict[str, Any] | None, loop: Loop, seed: int, env: dist.DistEnv, parts: dict[str, Any]) -> int:
    """Restores a bare loop's checkpoint (`checkpoint_state`) if given, else seeds this rank;
    returns the global step."""
    if state is None:
        seeds.seed_all(seeds.rank_seed(seed, env.rank))
        return 0
    loop_parts(loop, seed, env, lambda: state["step"], parts).load(state)
    return state["step"]


def older_layout(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint saved before parts were registered (`train.resume_from` of an older set) in
    today's layout: the loop's and the job's parts were under `parts`, model and optimizer at the top."""
    weights = {k: checkpoint[k] for k in ("model", "optimizer") if k in checkpoint} or None
    return {**checkpoint, **checkpoint["parts"], "weights": weights, "counters": {"step": checkpoint["step"]}}


def read_shards(path: str | Path, target: dict[str, Any], store: Store | None = None) -> None:
    """Loads a sharded checkpoint's tensors into `target` in place (DCP: each rank reads what its
    shards need, resharding when the world size changed); `path` may be a URL in the store."""
    import torch.distributed.checkpoint as dcp

    parent, name = str(path).rstrip("/").rsplit("/", 1)
    files = files_at(parent, store)
    with files.guard(f"reading {name}"):
        refusal = metadata_refusal(files, name)
    if refusal:
        raise CheckpointError(refusal)
    with files.guard(f"reading {name}"):
        dcp.load(target, **files.dcp(name, writing=False))
