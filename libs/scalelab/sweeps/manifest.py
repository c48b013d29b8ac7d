"""A sweep's manifest: `Search`, everything its workers need, fixed at submit time, and the keys
that one job array cannot vary. Shared by submit (search, sweep), the workers and collect, which
import it and not each other."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from scalelab.config.overrides import apply
from scalelab.config.space import Dimension
from scalelab.runtime.io import atomic_write_json

# one job array has one job shape: these cannot be swept (submit one sweep per shape)
SHAPE_KEYS = ("train.num_nodes", "train.nproc_per_node", "train.threads_per_process", "train.launcher")


@dataclasses.dataclass
class Search:
    """The manifest of a search: everything a worker needs, fixed at submit time."""

    name: str
    folder: str
    method: str
    trials: int
    parallel: int
    metric: str
    mode: str
    pruner: str
    space: list[dict[str, Any]]
    storage: str
    data: str
    raw: dict[str, Any]  # the params tree at submit time: a later edit of params.yaml changes nothing
    launcher: str
    heartbeat_s: float
    seed: int
    parent_run_id: str = ""
    elements: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def dims(self) -> dict[str, Dimension]:
        return {d["key"]: Dimension.from_dict(d) for d in self.space}

    def path(self, *parts: str) -> Path:
        return Path(self.folder).joinpath(*parts)

    def trial_dir(self, number: int) -> Path:
        return self.path("trials", f"{number:04d}")

    def save(self) -> None:
        atomic_write_json(self.path("manifest.json"), dataclasses.asdict(self))

    @classmethod
    def load(cls, folder: str | Path) -> Search:
        return cls(**json.loads((Path(folder) / "manifest.json").read_text()))

    def trial_params(self, values: dict[str, Any]) -> dict[str, Any]:
        """The params tree of one trial: the sampled values, and the objective as the best metric."""
        return apply(self.raw, {**values, "train.best_metric": self.metric, "train.best_mode": self.mode})


def info(search: Search) -> dict[str, Any]:
    return {"study": search.name, "storage": search.storage, "pruner": search.pruner, "metric": search.metric}
