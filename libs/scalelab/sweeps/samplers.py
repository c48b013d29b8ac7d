"""How a sweep picks its points: the grid (one list of elements, whoever runs them) and Optuna's
samplers, built from `config.names.SAMPLERS` (what `--method` allows), keyed the same (a test
checks it). A new sampler is its entry there and its builder here.

The grid has one path: `grid_points`, every combination of the listed values in the order of the
-S options. A grid on SLURM submits these points as the elements of one job array (sweep.py); a
local grid, or one that is pruned, runs them as trials (search_worker.py), each trial taking the
first point that no live trial holds (`next_point`): in the array's order, a lost trial's point is
run again, and a budget larger than the grid goes round it again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from scalelab.config import ConfigError, names
from scalelab.config.overrides import expand
from scalelab.config.space import Dimension


def grid_points(space: dict[str, Dimension]) -> list[dict[str, Any]]:
    """Every combination of the space's listed values, as {key: value} dicts.

    Raises:
        ConfigError: a dimension that is a range (loguniform, int, ...), not a list.
    """
    drawn = [k for k, d in space.items() if d.kind != "choice"]
    if drawn:
        raise ConfigError(
            f"-S {drawn[0]}={space[drawn[0]].describe()}: --method grid takes lists of values; "
            "use --method tpe or random to sample a range"
        )
    return expand({k: list(d.choices) for k, d in space.items()})


def next_point(space: dict[str, Dimension], trials: list[Any]) -> dict[str, Any]:
    """The grid point the next trial runs: the first held by the fewest trials, a lost one's aside."""
    keys = list(space)

    def held(point: dict[str, Any]) -> int:
        mine = [json.dumps(point[k]) for k in keys]  # a choice's Optuna value is its JSON text
        return sum(1 for t in trials if not t.user_attrs.get("lost") and [t.params.get(k) for k in keys] == mine)

    return min(grid_points(space), key=held)


def _grid(optuna: Any, space: dict[str, Dimension], study: Any, seed: int, budget: int) -> Any:
    """Puts the next grid point first in the study's queue (Optuna's `enqueue_trial`), so that the
    trial asked next takes it; the sampler itself draws nothing."""
    trials = study.get_trials(deepcopy=False)
    study.enqueue_trial({k: json.dumps(v) for k, v in next_point(space, trials).items()})
    return optuna.samplers.RandomSampler(seed=seed)


def _tpe(optuna: Any, space: dict[str, Dimension], study: Any, seed: int, budget: int) -> Any:
    startup = max(2, min(10, budget // 4))  # random points first, then the model
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True, constant_liar=True)


def _random(optuna: Any, space: dict[str, Dimension], study: Any, seed: int, budget: int) -> Any:
    return optuna.samplers.RandomSampler(seed=seed)


# each sampler of config/names.py: (optuna, space, study, seed, budget of trials) -> an Optuna sampler
SAMPLERS: dict[str, Callable[[Any, dict[str, Dimension], Any, int, int], Any]] = {
    "grid": _grid,
    "tpe": _tpe,
    "random": _random,
}


def make_sampler(method: str, space: dict[str, Dimension], study: Any, seed: int, budget: int) -> Any:
    """The Optuna sampler of `--method` for the next trial of `study` (asked under the sweep's
    lock); `seed` is the search's seed, mixed with the number of trials asked so far: parallel
    workers draw different points, and a rerun of the same history draws the same ones.

    Raises:
        ConfigError: a name that config/names.py does not list, never built as another sampler.
    """
    import optuna

    build = SAMPLERS[names.check("--method", method, names.SAMPLERS)]
    return build(optuna, space, study, seed * 100_003 + len(study.get_trials(deepcopy=False)), budget)
