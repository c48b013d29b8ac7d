"""A search trial's link to its Optuna study, as the training job sees it.

`scalelab sweep` writes `<trial folder>/trial.json` before the trial's job starts; `job.run` finds
it there (any launcher: in-process, torchrun, SLURM) and, at each validation, asks `should_prune`.
Global rank 0 reports the objective to the study and takes the pruner's decision; every rank gets
that decision, so all of them stop at the same step. Without the file there is no pruning.

The pruners' names are `config.names.PRUNERS` (what `--pruner` allows); `PRUNERS` here builds each,
keyed the same (a test checks it). A new pruner is its entry there and its builder here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalelab.config import names
from scalelab.runtime import dist

TRIAL_FILE = "trial.json"
# each pruner of config/names.py, built with the resource counted in validations (1, 2, ...)
PRUNERS: dict[str, Callable[[Any], Any]] = {
    "none": lambda optuna: optuna.pruners.NopPruner(),
    "median": lambda optuna: optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0),
    "hyperband": lambda optuna: optuna.pruners.HyperbandPruner(min_resource=1, reduction_factor=3),
    "halving": lambda optuna: optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3),
}


def open_storage(url: str) -> Any:
    """A database URL (postgresql://...) as Optuna's RDB storage; a file path as its journal storage,
    which is safe under parallel writers (never a bare SQLite file on a shared path)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage

    if "://" in url:
        if url.startswith("postgresql://"):  # SQLAlchemy 2.1's default driver is psycopg 3; the lock pins psycopg2
            url = "postgresql+psycopg2://" + url.removeprefix("postgresql://")
        return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
    # an open(O_EXCL) lock file rather than a symlink: it works on every shared file system
    return JournalStorage(JournalFileBackend(url, lock_obj=JournalFileOpenLock(url)))


def make_pruner(name: str) -> Any:
    """The Optuna pruner `name` of config/names.py (`median`: below the median of earlier trials at
    the same validation, after 2 finished; `hyperband`; `halving`: successive halving, a third of
    the trials kept at each rung of 1, 3, 9, ... validations; `none`).

    Raises:
        ConfigError: any other name, never built as another pruner.
    """
    import optuna

    return PRUNERS[names.check("--pruner", name, names.PRUNERS)](optuna)


def load_study(info: dict[str, Any]) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(
        study_name=info["study"], storage=open_storage(info["storage"]), pruner=make_pruner(info["pruner"])
    )


class Pruning:
    """`should_prune(val_metrics, validation, env)` on every rank after each validation."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.info = info
        self._trial: Any = None

    @classmethod
    def of(cls, out_dir: str | Path) -> Pruning | None:
        path = Path(out_dir) / TRIAL_FILE
        return cls(json.loads(path.read_text())) if path.is_file() else None

    def should_prune(self, metrics: dict[str, float], validation: int, env: dist.DistEnv) -> bool:
        """Rank 0 reports `metrics[objective]` at `validation` (1, 2, ...) and asks the pruner."""
        decision = False
        if env.is_main:
            if self._trial is None:
                import optuna

                self._trial = optuna.trial.Trial(load_study(self.info), self.info["trial_id"])
            self._trial.report(metrics[self.info["metric"]], validation)
            decision = self._trial.should_prune()
        return bool(dist.broadcast_object(decision))
