"""What experiment tracking costs a training step: the same loop with tracking off and on.

    scalelab bench tracking --out results/bench       # -> results/bench/tracking_overhead.json

The method is METHOD below; the JSON file carries it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from scalelab import tracking
from scalelab.runtime import seeds
from scalelab.runtime.io import atomic_write_json
from scalelab.tracking import provenance
from scalelab.training import workloads
from scalelab.training.loop import Loop, Optim, build_loop
from scalelab.training.meter import Meter

METHOD = """\
One process, strategy `single`, the training step (training.loop.Loop.step on the `mlp`
workload), synthetic batches already in memory, `--threads` torch threads. The batch size is
calibrated so that a step takes about `--target-step-ms` (10 ms). Three arms run interleaved in
every repeat, in a rotating order, so that machine noise hits all of them alike:

- `off`: the no-op tracker (what `tracking.enabled: false` runs);
- `batched`: the MLflow tracker as training uses it with `log_every_steps: 1`: every step logs
  train_loss, step_time_ms and samples_per_s into memory; every `--flush-every` steps (the
  checkpoint cadence) the buffer goes to the writer process (log_batch into SQLite);
- `sync`: for contrast, one synchronous `MlflowClient.log_metric` call per metric per step.

Every step's wall time covers the step, the metric window (training.meter.Meter, a sync point, in all
arms) and the tracking calls. Reported per arm: the median and mean step time over all repeats.
The overhead ratio is the median over repeats of (arm median / off median) of the same repeat;
the amortized ratio does the same with means, so it also charges the rare slow steps. The writer
process starts once per job, as in training (`writer_start_s`, before the timed repeats); after
each batched arm the bench waits until the writer has stored everything (`batched_drain_ms`, not
in the step times), so its work never falls into another arm. `writer_cpu_ms_per_step` is the CPU
the writer process spends per batched step: it runs beside training on a spare core, and adds to
the step time on a machine with none (see `loadavg_1m_before_after` and `cpu_cores`). The store is
a fresh SQLite mlflow.db in a temporary folder beside the output, deleted at the end.
"""
OUT_FILE = "tracking_overhead.json"
TARGET_RATIO = 1.01
ARMS = ("off", "batched", "sync")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="timed steps per arm and repeat")
    parser.add_argument("--sync-steps", type=int, default=60, help="timed steps of the sync arm per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--flush-every", type=int, default=50, help="steps between flushes (checkpoint cadence)")
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--batch-size", type=int, default=128, help="start of the calibration")
    parser.add_argument("--target-step-ms", type=float, default=10.0, help="0: keep --batch-size")
    parser.add_argument("--threads", type=int, default=1)


class SyncTracker(tracking.Tracker):
    """One synchronous `log_metric` call per metric, timing each call."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.call_s: list[float] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            start = time.perf_counter()
            self.client.log_metric(self.run_id, key, value, step=step)
            self.call_s.append(time.perf_counter() - start)

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


class Bench:
    """The model, its batches and the loop that times steps (built by `build_bench`)."""

    def __init__(self, loop: Loop, batches: list[Any], batch_size: int) -> None:
        self.loop, self.batches, self.batch_size = loop, batches, batch_size

    def run(self, tracker: tracking.Tracker, steps: int, flush_every: int, first_step: int = 1) -> list[float]:
        """Times `steps` steps with `tracker`; returns seconds per step."""
        meter = Meter(0, self.batch_size)
        times = []
        for step in range(first_step, first_step + steps):
            start = time.perf_counter()
            meter.add(step, self.loop.step([self.batches[step % len(self.batches)]]))
            tracker.log_metrics(meter.window(step, self.loop.device), step)
            if step % flush_every == 0:
                tracker.flush(wait=False)
            times.append(time.perf_counter() - start)
        return times


def build_bench(args: argparse.Namespace) -> Bench:
    """The `mlp` workload under strategy `single`, with its batch size calibrated."""
    torch.set_num_threads(args.threads)
    seeds.seed_all(0)
    wl = workloads.load("mlp", {"hidden": args.hidden, "dropout": 0.0}, input_shape=[args.features], num_classes=10)
    optim = Optim(name="sgd", lr=1e-3)
    loop = build_loop(wl, torch.device("cpu"), strategy_name="single", precision="fp32", optim=optim)
    batch = args.batch_size
    for _ in range(3 if args.target_step_ms > 0 else 0):  # step time is about linear in the batch
        times = _bench(loop, batch, args.features).run(tracking.NullTracker(), 30, 10**9)[10:]
        batch = max(8, min(1 << 16, round(batch * args.target_step_ms / (1000 * statistics.median(times)))))
    return _bench(loop, batch, args.features)


def _bench(loop: Loop, batch: int, features: int) -> Bench:
    batches = [(torch.randn(batch, features), torch.randint(10, (batch,))) for _ in range(2)]
    return Bench(loop, batches, batch)


def measure(args: argparse.Namespace, store: Path) -> dict[str, Any]:
    """Runs the interleaved repeats; returns per-arm, per-repeat step times (s) and call times."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    exp = tracking.experiment_id(client, "bench-tracking")
    bench = build_bench(args)
    bench.run(tracking.NullTracker(), args.warmup_steps, 10**9)
    trackers: dict[str, tracking.Tracker] = {
        "off": tracking.NullTracker(),
        "batched": tracking.MlflowTracker(client, client.create_run(exp, run_name="batched").info.run_id),
        "sync": SyncTracker(client, client.create_run(exp, run_name="sync").info.run_id),
    }
    start = time.perf_counter()  # once per job: start the writer process and store a first batch
    trackers["batched"].log_metrics({"start": 0.0}, 0)
    trackers["batched"].flush(wait=False)
    trackers["batched"].flush(wait=True)
    raw: dict[str, Any] = {
        "times": {arm: [] for arm in ARMS},
        "drain_s": [],
        "writer_start_s": time.perf_counter() - start,
        "batch_size": bench.batch_size,
        "loadavg_1m": [os.getloadavg()[0]],
    }
    writer = psutil.Process(trackers["batched"].writer_pid)
    cpu_start_s = sum(writer.cpu_times()[:2])
    for rep in range(args.repeats):
        for arm in ARMS[rep % 3 :] + ARMS[: rep % 3]:
            steps = args.sync_steps if arm == "sync" else args.steps
            raw["times"][arm].append(bench.run(trackers[arm], steps, args.flush_every, 1 + rep * steps))
            start = time.perf_counter()
            trackers[arm].flush(wait=True)  # the writer is idle before the next arm starts
            if arm == "batched":
                raw["drain_s"].append(time.perf_counter() - start)
    raw["writer_cpu_s"] = sum(writer.cpu_times()[:2]) - cpu_start_s
    raw["loadavg_1m"].append(os.getloadavg()[0])
    for tracker in trackers.values():
        tracker.finish()
    raw["log_metric_s"] = trackers["sync"].call_s
    return raw


def _paired_ratio(stat: dict[str, list[float]], arm: str) -> float:
    """Median over repeats of arm / off, each pair taken from the same repeat."""
    return statistics.median(a / o for a, o in zip(stat[arm], stat["off"]))


def _ms(times: list[list[float]], stat: Any) -> float:
    return 1000.0 * stat([x for rep in times for x in rep])


def summarize(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Medians, means and paired ratios (figures in ms) plus the method, for the JSON file."""
    times = raw["times"]
    med = {arm: [statistics.median(r) for r in reps] for arm, reps in times.items()}
    mean = {arm: [statistics.fmean(r) for r in reps] for arm, reps in times.items()}
    overhead = _paired_ratio(med, "batched")
    writer_s_per_step = raw["writer_cpu_s"] / (args.steps * args.repeats)
    return {
        "benchmark": "tracking_overhead",
        "method": METHOD.strip(),
        "workload": {
            "name": "mlp",
            "features": args.features,
            "hidden": args.hidden,
            "batch_size": raw["batch_size"],
            "strategy": "single",
            "device": "cpu",
            "threads": args.threads,
            "target_step_ms": args.target_step_ms,
        },
        "steps_per_repeat": {"off": args.steps, "batched": args.steps, "sync": args.sync_steps},
        "repeats": args.repeats,
        "flush_every_steps": args.flush_every,
        "store": "sqlite",
        "median_step_ms": {arm: _ms(reps, statistics.median) for arm, reps in times.items()},
        "mean_step_ms": {arm: _ms(reps, statistics.fmean) for arm, reps in times.items()},
        "repeat_median_step_ms": {arm: [1000.0 * x for x in xs] for arm, xs in med.items()},
        "overhead_ratio": overhead,
        "overhead_pct": 100.0 * (overhead - 1.0),
        "repeat_overhead_ratios": [a / o for a, o in zip(med["batched"], med["off"])],  # the spread: resolution
        "amortized_overhead_ratio": _paired_ratio(mean, "batched"),
        "sync_overhead_ratio": _paired_ratio(med, "sync"),
        "sync_log_metric_ms_median": 1000.0 * statistics.median(raw["log_metric_s"]),
        "batched_drain_ms_median": 1000.0 * statistics.median(raw["drain_s"]),
        "writer_cpu_ms_per_step": 1000.0 * writer_s_per_step,
        "writer_cpu_fraction_of_off_step": 1000.0 * writer_s_per_step / _ms(times["off"], statistics.median),
        "loadavg_1m_before_after": raw["loadavg_1m"],
        "cpu_cores": os.cpu_count(),
        "writer_start_s": raw["writer_start_s"],
        "target_overhead_ratio": TARGET_RATIO,
        "meets_target": overhead <= TARGET_RATIO,
        "host": socket.gethostname(),
        "cpu": provenance.cpu_model(),
        "torch": torch.__version__,
    }


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Measures, writes `<out_dir>/tracking_overhead.json` and returns its content."""
    out_dir.mkdir(parents=True, exist_ok=True)
    store = Path(tempfile.mkdtemp(prefix=".bench-tracking-", dir=out_dir))
    try:
        result = summarize(measure(args, store), args)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    atomic_write_json(out_dir / OUT_FILE, result)
    return result


def headline(result: dict, out: Path) -> str:
    """One line with the figures and their units."""
    med = result["median_step_ms"]
    return (
        f"tracking overhead: {result['overhead_pct']:+.2f}% median step time "
        f"(off {med['off']:.2f} ms, batched {med['batched']:.2f} ms, amortized ratio "
        f"{result['amortized_overhead_ratio']:.4f}; sync log_metric {med['sync']:.2f} ms/step, "
        f"{result['sync_log_metric_ms_median']:.2f} ms/call) -> {out / OUT_FILE}"
    )
