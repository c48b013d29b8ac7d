"""PowerSGD's state (torch's `PowerSGDState`) as a checkpoint part, for strategy `ddp_powersgd`.

torch keys the hook's memory (each rank's error feedback, the low-rank factors P and Q) by bucket,
and DDP regroups its buckets after its first step; a resumed DDP starts from its first grouping
again. So the state goes out per parameter (by its position in the model) and back into whichever
bucket holds the parameter at its next reduction: a resumed run compresses bitwise as the
uninterrupted one (tests/training/test_strategy_registry.py).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)


def hook(part, bucket):  # unannotated: DDP checks a hook's annotations against its own types
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    part.place(bucket)
    return powerSGD_hook(part.state, bucket)


class PowerSGDPart:
    """A PowerSGDState with `state_dict()` (only what `weights_only` loads) and `load_state_dict()`;
    `hook` calls `place` before each bucket's reduction."""

    MEMORIES = ("error_dict", "p_memory_dict", "q_memory_dict")

    def __init__(self, state: Any, module: nn.Module, device: torch.device) -> None:
        self.state, self.device = state, device
        params = list(module.parameters())
        self.positions = {id(p): i for i, p in enumerate(params)}
        self.shapes = [(p.shape[0], p.numel() // p.shape[0]) if p.dim() else (1, 1) for p in params]  # the hook's view
        self.layout: dict[int, list[int]] = {}  # bucket index -> its parameters' positions, in order
        self.restored: dict[str, dict[int, torch.Tensor]] = {}  # per memory: position -> its part, until placed

    def segments(self, positions: list[int]) -> dict[str, dict[int, tuple[int, int]]]:
        """Each parameter's (offset, length) in a bucket's error, P and Q memory, as the hook lays
        them out: the error in bucket order; P and Q of the compressed ones, grouped by shape."""
        found: dict[str, dict[int, tuple[int, int]]] = {name: {} for name in self.MEMORIES}
        offset, groups = 0, {}
        for pos in positions:
            n, m = self.shapes[pos]
            found["error_dict"][pos] = (offset, n * m)
            offset += n * m
            rank = min(n, m, self.state.matrix_approximation_rank)
            if (n + m) * rank * self.state.min_compression_rate < n * m:  # the hook's _should_compress
                groups.setdefault((n, m), []).append(pos)
        p_at = q_at = 0
        for (n, m), members in groups.items():
            rank = min(n, m, self.state.matrix_approximation_rank)
            for pos in members:
                found["p_memory_dict"][pos], found["q_memory_dict"][pos] = (p_at, n * rank), (q_at, m * rank)
                p_at, q_at = p_at + n * rank, q_at + m * rank
        return found

    def place(self, bucket: Any) -> None:
        """Records the bucket's parameters before its reduction. When DDP has regrouped them (after
        its first step; a restore counts as one), every bucket's memory is taken apart per
        parameter, and each bucket's is put together again in its new order as it comes."""
        index, now = bucket.index(), [self.positions[id(p)] for p in bucket.parameters()]
        if self.layout.get(index, now) != now:
            self.restored = self.per_param()
            for name in self.MEMORIES:
                getattr(self.state, name).clear()
            self.layout = {}
        self.layout[index] = now
        for name, spans in self.segments(now).items():
            parts = self.restored.get(name, {})
            if spans and all(pos in parts for pos in spans):
                flat = torch.zeros(sum(length for _, length in spans.values()), device=self.device)
                for pos, (at, length) in spans.items():
                    flat[at : at + length] = parts.pop(pos)
                getattr(self.state, name)[index] = flat

    def per_param(self) -> dict[str, dict[int, torch.Tensor]]:
        """Each memory as position -> that parameter's part (on this process's device)."""
        found = {name: dict(self.restored.get(name, {})) for name in self.MEMORIES}
        for index, positions in self.layout.items():
            for name, spans in self.segments(positions).items():
                memory = getattr(self.state, name).get(index)
                for pos, (at, length) in spans.items() if memory is not None else ():
                    found[name][pos] = memory[at : at + length].detach().clone()
        return found

    def state_dict(self) -> dict[str, Any]:
        """Every rank calls it (its errors are gathered: each rank's own)."""
        from scalelab.runtime import dist

        s, cpu = self.state, lambda memory: {pos: t.cpu() for pos, t in memory.items()}  # noqa: E731
        per_param = self.per_param()
        _, keys, pos, has_gauss, cached = s.rng.get_state()
        return {
            "iter": s.iter,
            "p": cpu(per_param["p_memory_dict"]),
            "q": cpu(per_param["q_memory_dict"]),
            "rng": {"keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos), "gauss": [int(has_gauss), cached]},
            "numel": [s.total_numel_before_compression, s.total_numel_after_compression, s.next_stats_report],
            "errors": dist.all_gather_object(cpu(per_param["error_dict"])),
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        import numpy as np
        import torch.distributed as tdist

        s = self.state
        s.iter = saved["iter"]
        rng = saved["rng"]
        s.rng.set_state(("MT19937", rng["keys"].numpy().astype(np.uint32), rng["pos"], *rng["gauss"]))
        s.total_numel_before_compression, s.total_numel_after_compression, s.next_stats_report = saved["numel"]
        rank, world = (tdist.get_rank(), tdist.get_world_size()) if tdist.is_initialized() else (0, 1)
        errors = saved["errors"]
        if len(errors) != world:
            log.warning("PowerSGD's error feedback, saved by %d ranks, starts anew on %d", len(errors), world)
        for name in self.MEMORIES:
            getattr(s, name).clear()
        self.layout = {}
        mine = errors[rank] if len(errors) == world else {}
        on = lambda memory: {pos: t.to(self.device) for pos, t in memory.items()}  # noqa: E731
        self.restored = {"error_dict": on(mine), "p_memory_dict": on(saved["p"]), "q_memory_dict": on(saved["q"])}
