"""Sweeps: a grid of params overrides submitted as one SLURM job array, or a search.

    scalelab sweep submit  --name lr-seed -S train.lr=0.001,0.003 -S train.seed=0,1
    scalelab sweep status  --name lr-seed
    scalelab sweep collect --name lr-seed     # -> results/sweeps/lr-seed/summary.csv, summary_by_setting.csv
    scalelab sweep submit  --name lr --method tpe --trials 40 --parallel 4 --pruner median \\
        -S 'train.lr=loguniform(1e-4,1e-1)'   # a search: scalelab.sweeps.search

`submit` validates every element (params, data, pre-flight) before anything is submitted, makes one
MLflow parent run and one child per element, submits the array and returns at once. Each element
is a (possibly multi-node) DDP job that logs into its own child run; a failing element does not
stop the others. Values reach the jobs as data, in each element's resolved.json, never through a shell.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from scalelab.config import ConfigError, Params, names, parse_params, read_yaml
from scalelab.config.loader import check_name
from scalelab.config.overrides import apply, parse_overrides
from scalelab.config.space import parse_space
from scalelab.data.store import verify
from scalelab.launch import slurm
from scalelab.runtime.io import atomic_write_json
from scalelab.runtime.paths import repo_root
from scalelab.sweeps.manifest import SHAPE_KEYS, Search
from scalelab.sweeps.samplers import grid_points
from scalelab.sweeps.sweep_table import BY_SETTING_FILE, best_line, by_setting, write_by_setting
from scalelab.tracking import MlflowTracker, tracking_uri
from scalelab.training.outputs import RUN_MEANS
from scalelab.training.submit import TrainJob, resolve

SWEEPS = "results/sweeps"  # under the workspace (runtime.paths.repo_root), whatever the working folder


def sweeps_root() -> Path:
    """Where sweeps live: results/sweeps of the workspace, never of the current directory."""
    return repo_root() / SWEEPS


SETTING_SECTIONS = ("sweep", "slurm")  # -S keys that configure the submission: one value, never a dimension


def settings(params_file: str, specs: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The params tree with the command's own settings applied (`-S sweep.launcher=local`), and
    the -S specs left for the grid or search space.

    Raises:
        ConfigError: a setting with more than one value, or a value the schema refuses.
    """
    raw, rest = read_yaml(params_file), []
    for spec in specs:
        if spec.partition("=")[0].split(".")[0] not in SETTING_SECTIONS:
            rest.append(spec)
            continue
        ((key, values),) = parse_overrides([spec]).items()
        if len(values) != 1:
            raise ConfigError(
                f"-S {spec}: {key} is a setting of the submission, not a dimension of the sweep: give one value"
            )
        raw = apply(raw, {key: values[0]})
    parse_params(raw, params_file)  # a bad setting fails here, naming its key
    if not rest:
        raise ConfigError("-S: give at least one key to sweep over, e.g. -S train.lr=0.001,0.003")
    return raw, rest


def plan(params_file: str, raw: dict[str, Any], specs: list[str]) -> tuple[Params, list[tuple[dict, Params]]]:
    """Validates the base params and every element; returns (base, [(overrides, params)])."""
    base = parse_params(raw, params_file)
    space = parse_space(specs)
    bad = [k for k in space if k in SHAPE_KEYS]
    if bad:
        raise ConfigError(
            f"-S {bad[0]} is not allowed in a sweep: one job array has one job shape "
            f"({', '.join(SHAPE_KEYS)}); submit one sweep per shape"
        )
    elements = []
    for overrides in grid_points(space):  # the grid's one list of points, as a local grid runs them
        try:
            elements.append((overrides, parse_params(apply(raw, overrides), params_file)))
        except ConfigError as exc:
            raise ConfigError(f"sweep element {overrides}: {exc}") from None
    return base, elements


def submit(args: argparse.Namespace) -> int:
    check_name("--name", args.name)
    names.check("--method", args.method, names.SAMPLERS)  # before anything starts, grid or search
    names.check("--pruner", args.pruner, names.PRUNERS)
    folder = sweeps_root() / args.name
    if (folder / "manifest.json").exists():
        raise ConfigError(f"--name {args.name!r}: {folder} already holds a sweep; pick another name")
    raw, specs = settings(args.params, args.set)
    if args.method != "grid" or parse_params(raw, args.params).sweep.launcher == "local" or args.trials:
        from scalelab.sweeps import search

        return search.submit(args, folder, raw, specs)
    if args.pruner != "none":
        raise ConfigError(f"--pruner {args.pruner}: a grid on SLURM trains every element; give --trials to search")
    base, elements = plan(args.params, raw, specs)
    verify(args.data)
    profile = slurm.load_profile(base.slurm.profile)
    for _, params in elements:
        slurm.preflight(params, profile, tracking_uri())
    ex = slurm.train_executor(base, profile, name=f"sweep-{args.name}")  # no SLURM client: fails here
    ex.update_parameters(slurm_array_parallelism=args.parallel or base.sweep.array_parallelism)
    data_dir = str(Path(args.data).resolve())
    for i, (_, params) in enumerate(elements):  # a plan that does not fit fails here, before any run
        resolve(params, data_dir, folder / f"{i:03d}")
    parent = MlflowTracker.open(
        base.tracking.experiment,
        run_name=f"sweep-{args.name}",
        tags={"scalelab.kind": "sweep", "scalelab.sweep": args.name},
    )
    parent.log_params({"overrides": " ".join(args.set), "elements": len(elements)})
    jobs, children = [], []
    # the metric each element's best.pt follows ranks the elements in collect
    manifest = {"name": args.name, "parent_run_id": parent.run_id, "metric": base.train.best_metric}
    manifest.update(mode=base.train.best_mode, elements=[])
    from scalelab.sweeps.search import abandoned_on_failure

    with abandoned_on_failure(parent, folder, children), ex.batch():
        for i, (overrides, params) in enumerate(elements):
            child = _child_run(base, parent.run_id, args.name, i, overrides)
            children.append(child)
            params = dataclasses.replace(params, tracking=dataclasses.replace(params.tracking, run_id=child))
            out = (folder / f"{i:03d}").resolve()
            resolved = resolve(params, data_dir, out)
            jobs.append(ex.submit(TrainJob(str(resolved), data_dir, str(out), evaluate=base.sweep.evaluate)))
            manifest["elements"].append({"index": i, "overrides": overrides, "run_id": child, "out": str(out)})
    for element, job in zip(manifest["elements"], jobs):
        element.update(job_id=job.job_id, log_folder=str(job.paths.folder))
    atomic_write_json(folder / "manifest.json", manifest)
    print(
        f"submitted sweep {args.name!r}: {len(jobs)} elements as job array {jobs[0].job_id.split('_')[0]} "
        f"(at most {base.sweep.array_parallelism} at once); manifest: {folder / 'manifest.json'}"
    )
    return 0


def _child_run(base: Params, parent_id: str, name: str, index: int, overrides: dict[str, Any]) -> str:
    label = "-".join(f"{k.split('.')[-1]}{v}" for k, v in overrides.items())
    child = MlflowTracker.open(
        base.tracking.experiment,
        run_name=f"{name}-{index:03d}-{label}"[:200],
        parent_run_id=parent_id,
        tags={"scalelab.sweep": name, "scalelab.sweep_index": index},
    )
    child.log_params({f"override.{k}": v for k, v in overrides.items()})
    child.client.update_run(child.run_id, status="SCHEDULED")
    return child.run_id


def _manifest(name: str) -> dict[str, Any]:
    check_name("--name", name)
    path = sweeps_root() / name / "manifest.json"
    if not path.is_file():
        raise ConfigError(
            f"--name {name!r}: {path} does not exist; sweeps: "
            f"{', '.join(sorted(p.name for p in sweeps_root().glob('*'))) or 'none'}"
        )
    return json.loads(path.read_text())


def _job(element: dict[str, Any]) -> Any:
    import submitit

    return submitit.SlurmJob(folder=element["log_folder"], job_id=element["job_id"])


def _search(name: str) -> Any:
    """The search behind a manifest (None for a grid sweep)."""
    manifest = _manifest(name)
    if "method" not in manifest:
        return None

    return Search.load(sweeps_root() / name)


def status(args: argparse.Namespace) -> int:
    found = _search(args.name)
    if found is not None:
        from scalelab.sweeps.manifest import info
        from scalelab.sweeps.search_collect import reported_value
        from scalelab.training.pruning import load_study

        for t in load_study(info(found)).get_trials(deepcopy=False):  # the value as summary.csv's `value`
            print(f"trial {t.number:03d}  {t.state.name:<9}  {reported_value(t)!s:<12}  {t.params}")
        return 0
    for element in _manifest(args.name)["elements"]:
        print(f"{element['index']:03d}  {element['job_id']:>10}  {_job(element).state:<10}  {element['overrides']}")
    return 0


METRICS = (
    "train_loss",
    "val_loss",
    "val_accuracy",
    "test_accuracy",
    "test_loss",
    "perplexity",
    "bits_per_byte",
    "samples_per_s",
    "step_time_ms",
)


def _row(client: Any, element: dict[str, Any], metric: str = "val_loss") -> dict[str, Any]:
    job = _job(element)
    state = job.state
    row = {
        "index": element["index"],
        "job_id": element["job_id"],
        "state": state,
        **{f"override.{k}": v for k, v in element["overrides"].items()},
        "run_id": element["run_id"],
    }
    if state == "COMPLETED" and (Path(element["out"]) / "run.json").is_file():
        metrics = client.get_run(element["run_id"]).data.metrics
        figures = {k: metrics.get(RUN_MEANS.get(k, k)) for k in (f"best_{metric}", *METRICS)}
        row.update(status="finished", **figures, error="")
    elif slurm.has_ended(state):
        row.update(status="failed", error=slurm.error_line(job))
        if client.get_run(element["run_id"]).info.status in ("SCHEDULED", "RUNNING"):
            client.set_terminated(element["run_id"], status="FAILED")
    else:
        row.update(status="pending" if state in ("PENDING", "UNKNOWN", "REQUEUED") else "running", error="")
    return row


def collect(args: argparse.Namespace) -> int:
    """Writes results/sweeps/<name>/summary.csv: one row per element (its MLflow run id, failed ones
    with their error), and summary_by_setting.csv when train.seed is swept; prints both and the
    best element by the params' train.best_metric (`best_<metric>`, its best validation value)."""
    import pandas as pd

    from scalelab.tracking import runs

    found = _search(args.name)
    if found is not None:
        from scalelab.sweeps.search_collect import collect as collect_search

        collect_search(found)
        return 0
    manifest = _manifest(args.name)
    metric, mode = manifest.get("metric", "val_loss"), manifest.get("mode", "min")  # older manifests: the default
    client = runs.client()
    frame = pd.DataFrame([_row(client, e, metric) for e in manifest["elements"]])
    out = sweeps_root() / args.name / "summary.csv"
    frame.to_csv(out, index=False)
    print(f"{frame.to_string(index=False, max_colwidth=80)}\n-> {out}")
    finished = frame.status == "finished"
    figures = {k: k for k in (f"best_{metric}", *METRICS) if k in frame and frame[k][finished].notna().any()}
    table = by_setting(frame, "override.", figures, finished)
    if table is not None:
        print(write_by_setting(table, out.parent))
    print(_best(frame[finished], metric, mode))
    counts = frame.status.value_counts().to_dict()
    if counts.get("pending", 0) + counts.get("running", 0) == 0:
        parent = manifest["parent_run_id"]
        tracker = MlflowTracker.attach(parent)
        tracker.log_metrics({"finished": counts.get("finished", 0), "failed": counts.get("failed", 0)}, 0)
        tracker.log_artifact(out)
        if table is not None:
            tracker.log_artifact(out.parent / BY_SETTING_FILE)
        tracker.finish("FINISHED")
    return 0


def _best(finished: Any, metric: str, mode: str) -> str:
    """The best-line of the finished elements, by their best_<metric>."""
    import pandas as pd

    column = f"best_{metric}"
    values = pd.to_numeric(finished[column], errors="coerce").dropna() if column in finished else pd.Series([])
    if values.empty:
        return best_line(None, metric, None, None)
    row = finished.loc[values.idxmin() if mode == "min" else values.idxmax()]
    return best_line(f"element {row['index']:03d}", metric, values[row.name], row["run_id"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`scalelab sweep submit|status|collect`."""
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("submit", help="validate, submit the job array, and return")
    p.add_argument(
        "--name",
        required=True,
        help="the sweep's name: its folder results/sweeps/<name> and its MLflow parent run sweep-<name>",
    )
    p.add_argument(
        "--params", default="params.yaml", help="the params file every element starts from (default: params.yaml)"
    )
    p.add_argument(
        "--data",
        default="data/prepared",
        help="the prepared-data folder every element trains on (default: data/prepared)",
    )
    p.add_argument(
        "-S",
        "--set",
        action="append",
        required=True,
        metavar="KEY=SPACE",
        help="a params key and its values, repeated per key: a grid takes lists (train.lr=0.001,0.003), a search "
        "also ranges (loguniform(1e-4,1e-1), int(0,200), ...); sweep.* and slurm.* keys set the submission (one value)",
    )
    p.add_argument(
        "--method",
        default="grid",
        help=f"{', '.join(names.SAMPLERS)} (default: grid, every combination; config/names.py)",
    )
    p.add_argument("--trials", type=int, help="the budget of trials (tpe, random; grid: the grid's size)")
    p.add_argument("--parallel", type=int, help="trials at once (default: sweep.array_parallelism)")
    p.add_argument(
        "--objective",
        default="val_loss:min",
        help="<validation metric>:min|max that a search (or a local grid) optimises (default val_loss:min); a grid "
        "on SLURM ranks its elements by train.best_metric and train.best_mode instead",
    )
    p.add_argument("--pruner", default="none", help=f"{', '.join(names.PRUNERS)} (default: none; config/names.py)")
    for action, text in (
        ("status", "each element's or trial's state (a search: and its value)"),
        ("collect", "write summary.csv (and summary_by_setting.csv over seeds); print them and the best trial"),
    ):
        sub.add_parser(action, help=text).add_argument(
            "--name", required=True, help="the sweep's name, as given to submit"
        )
    w = sub.add_parser("worker")  # one local worker of a search (started by submit)
    w.add_argument("--folder", required=True, help="the search's folder (results/sweeps/<name>)")
    w.add_argument("--index", type=int, required=True, help="this worker's number, 0 to --parallel - 1")


def worker(args: argparse.Namespace) -> int:
    from scalelab.sweeps.search_worker import work_local

    return work_local(Search.load(args.folder), args.index)


def run(args: argparse.Namespace) -> int:
    return {"submit": submit, "status": status, "collect": collect, "worker": worker}[args.action](args)
