"""The strategies: one registered object each, holding what the config, the shape check and the
study know of it. `scalelab.training.strategy` extends each with how it wraps a model.

Callers ask the object (`get(train.strategy).distributed`, `baseline()`, `reference()`), never
compare its name (tests/layout/test_strategy_names.py). To add a strategy, add its row to
`STRATEGIES` here and its class to `training/strategy.py` (`KINDS`); the schema's allowed names
(`StrategyName`) and the study's rows (`speedup.strategies`) follow from this registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from scalelab.config.loader import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class Strategy:
    name: str  # the value of train.strategy and speedup.strategies
    label: str  # how the study's report and plots name it
    wrapper: str  # what training wraps the model in, as messages name it
    parallel: bool  # drives nproc_per_node devices per node; False: one process on one device
    distributed: bool = False  # one process per device (torchrun or SLURM tasks), and may span nodes
    sharded: bool = False  # parameters, gradients and optimizer state live as shards; built on meta
    min_cuda_devices: int = 0  # CUDA devices per node it needs, on any device setting
    cuda_only: bool = False  # runs on CUDA devices only: device 'cpu' is refused before anything starts
    activation_checkpointing: bool = True  # may recompute activations (dp's replica threads would share its state)
    # roles in the speedup study (one strategy each): the single-process seed every speedup is
    # measured against, and the scaling reference (the headline, the comm model, the crossover)
    baseline: bool = False
    reference: bool = False

    def processes(self, num_devices: int) -> int:
        """Processes that drive `num_devices` devices (of one node, or of all nodes together): one
        per device when distributed, else one (the world size for all nodes)."""
        return num_devices if self.distributed else 1

    def gpus_per_process(self, num_devices: int) -> int:
        """CUDA devices each process drives when `num_devices` are asked for per node: all of them
        for a one-process parallel strategy (dp), else one."""
        return num_devices // self.processes(num_devices)

    def data_parallel_degree(self, num_devices: int) -> int:
        """Model replicas (or shard groups) that each take a part of the global batch when
        `num_devices` are asked for: every device for a parallel strategy, else one."""
        return num_devices if self.parallel else 1


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(name="single", label="single process", wrapper="the plain model", parallel=False, baseline=True),
        Strategy(
            name="dp",
            label="DataParallel",
            wrapper="nn.DataParallel",
            parallel=True,
            min_cuda_devices=2,
            cuda_only=True,
            activation_checkpointing=False,
        ),
        Strategy(
            name="ddp", label="DDP", wrapper="DistributedDataParallel", parallel=True, distributed=True, reference=True
        ),
        Strategy(
            name="fsdp",
            label="FSDP",
            wrapper="FSDP2 fully_shard of the workload's shard_units",
            parallel=True,
            distributed=True,
            sharded=True,
        ),
        Strategy(
            name="ddp_powersgd",
            label="DDP + PowerSGD",
            wrapper="DistributedDataParallel with the PowerSGD gradient-compression hook",
            parallel=True,
            distributed=True,
        ),
    )
}


def baseline() -> Strategy:
    """The study's seed baseline: the single process that every speedup is measured against."""
    return _one("baseline")


def reference() -> Strategy:
    """The study's scaling reference: its headline, the comm model's prediction and the crossover."""
    return _one("reference")


def _one(role: str) -> Strategy:
    [found] = [s for s in STRATEGIES.values() if getattr(s, role)]  # exactly one (a test checks it)
    return found


def get(name: str) -> Strategy:
    """The registered strategy `name`.

    Raises:
        ConfigError: no strategy has that name; the message lists those that do.
    """
    try:
        return STRATEGIES[name]
    except KeyError:
        allowed = " | ".join(repr(n) for n in STRATEGIES)
        raise ConfigError(f"strategy = {name!r} is not allowed: expected one of {allowed}") from None
