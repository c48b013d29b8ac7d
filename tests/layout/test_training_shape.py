"""The training job stays small: `job.py` keeps process set-up and the job's end, the loop of
`Trainer.fit` fits on one screen, and every cadence is a callback (training.callbacks)."""

from __future__ import annotations

import inspect

from helpers import REPO
from scalelab.training import callbacks
from scalelab.training.trainer import Trainer

JOB = REPO / "libs/scalelab/training/job.py"


def test_job_py_is_under_150_lines():
    lines = len(JOB.read_text().splitlines())
    assert lines < 150, f"training/job.py has {lines} lines: the loop's work goes to the trainer or a callback"


def test_trainer_fit_is_under_60_lines():
    lines = len(inspect.getsource(Trainer.fit).splitlines())
    assert lines < 60, f"Trainer.fit has {lines} lines: a new cadence is a callback (training/callbacks.py)"


def test_every_cadence_is_a_callback_in_for_job():
    source = inspect.getsource(callbacks.for_job)
    found = [c for c in vars(callbacks).values() if isinstance(c, type) and issubclass(c, callbacks.Callback)]
    cadences = [c for c in found if c not in (callbacks.Callback, callbacks.Periodic)]
    assert len(cadences) >= 8  # log, progress bar, validate, best and early stop, prune, stop flag, checkpoint, profile
    assert all(f"{c.__name__}(" in source for c in cadences), [c.__name__ for c in cadences]
