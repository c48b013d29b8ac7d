"""What `scalelab sweep collect` prints and writes beside summary.csv, alike for a grid on SLURM
(scalelab.sweeps.sweep) and a search or a local grid (scalelab.sweeps.search_collect): the
table with each row's MLflow run id, the best trial's line with its run id, and, when `train.seed`
is one of the swept keys, the mean and spread over the seeds of each setting (the other swept keys'
values) in summary_by_setting.csv."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

SEED_KEY = "train.seed"
BY_SETTING_FILE = "summary_by_setting.csv"


def by_setting(frame: Any, prefix: str, figures: dict[str, str], finished: Any) -> Any:
    """One row per setting: the values of the swept keys other than train.seed (the columns named
    `prefix` + key), `seeds` (the seeds of its finished rows), `n` (how many), `runs` (its rows,
    whatever their state), and `<name>_mean` and `<name>_std` (sample standard deviation, n - 1;
    empty for n < 2) of each column of `figures` {column: name} over its finished rows (`finished`,
    a boolean Series on `frame`'s index). None when train.seed is not swept.
    """
    import pandas as pd

    seed = prefix + SEED_KEY
    if seed not in frame.columns:
        return None
    keys = [c for c in frame.columns if c.startswith(prefix) and c != seed]
    # a list or mapping value (train.model.hidden=[32],[64]) is grouped by its JSON text
    keyed = frame[keys].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
    groups = keyed.groupby(keys, dropna=False, sort=False) if keys else [((), frame)]
    rows = []
    for setting, keyed_rows in groups:
        values = setting if isinstance(setting, tuple) else (setting,)
        group = frame.loc[keyed_rows.index]
        done = group[finished.loc[group.index]]
        row: dict[str, Any] = {**dict(zip(keys, values)), "seeds": " ".join(str(s) for s in done[seed])}
        row.update(n=len(done), runs=len(group))
        for column, name in figures.items():
            got = pd.to_numeric(done[column], errors="coerce").dropna() if column in done else pd.Series([])
            row[f"{name}_mean"] = float(got.mean()) if len(got) else math.nan
            row[f"{name}_std"] = float(got.std(ddof=1)) if len(got) > 1 else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def write_by_setting(table: Any, folder: Path) -> str:
    """Writes `table` (by_setting) to <folder>/summary_by_setting.csv; returns the lines to print."""
    out = folder / BY_SETTING_FILE
    table.to_csv(out, index=False)
    shown = table.to_string(index=False, max_colwidth=60, float_format=lambda v: f"{v:.6g}")
    return f"per setting, over the seeds ({SEED_KEY}) of its finished runs: mean, std (n - 1), n\n{shown}\n-> {out}"


def best_line(label: str | None, metric: str, value: float | None, run_id: str | None) -> str:
    """'best: trial 3, val_loss = 0.1234, run <MLflow run id>' (`label` None: nothing finished)."""
    if label is None or value is None:
        return f"best: none yet (no finished trial with a {metric})"
    return f"best: {label}, {metric} = {value:.6g}, run {run_id}"
