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
import yaml

from scalelab import tracking
from scalelab.bench import stats, stopflag_cost
from scalelab.config.schema import SlurmConfig
from scalelab.runtime import seeds
from scalelab.runtime.io import atomic_write_json
from scalelab.runtime.paths import repo_root
from scalelab.tracking import provenance
from scalelab.training import workloads
from scalelab.training.loop import Loop, Optim, build_loop
from scalelab.training.meter import Meter

METHOD = """\
One process, strategy `single`, the training step (training.loop.Loop.step on the `mlp`
workload), synthetic batches already in memory, `--threads` torch threads. The batch size is
calibrated so that a step takes about `--target-step-ms` (10 ms). Five arms run interleaved in
every repeat, in a rotating order, so that machine noise hits all of them alike:

- `off`: the no-op tracker (what `tracking.enabled: false` runs), a metric window every step;
- `batched`: the MLflow tracker as training uses it with `log_every_steps: 1`: every step logs
  train_loss, step_time_ms and samples_per_s into memory; every `--flush-every` steps (the
  checkpoint cadence) the buffer goes to the writer process (log_batch into SQLite);
- `off_default`, `batched_default`: the same two at the default cadence, a window and a
  log_metrics call every `--default-log-every` steps (params.yaml train.log_every_steps);
- `sync`: for contrast, one synchronous `MlflowClient.log_metric` call per metric per step.

Every step's wall time covers the step, the metric window (training.meter.Meter, a sync point, in all
arms, at the arm's cadence) and the tracking calls. The training thread's own CPU time in the
tracker calls (`time.thread_time_ns` around log_metrics and flush(wait=False)) is summed per step:
`in_thread_us_per_step` is its mean over all steps of an arm (flush steps included), and its
fraction of the `off` median step is the figure with the goal <= 1% at log_every_steps 1. The
wall-time A/B of each cadence is the median over repeats of batched/off with a bootstrap 95%
interval over repeats (scalelab.bench.stats); at the default cadence the goal is an interval that
includes 1 (no measurable overhead). Reported per arm: the median and mean step time over all repeats.
The overhead ratio is the median over repeats of (arm median / off median) of the same repeat;
the amortized ratio does the same with means, so it also charges the rare slow steps. The writer
process starts once per job, as in training (`writer_start_s`, before the timed repeats; the
two batched arms have one each, started side by side); after each batched arm the bench waits
until the writer has stored everything (`batched_drain_ms`, not in the step times), so its work
never falls into another arm. `writer_cpu_ms_per_step` is the CPU (user + system, psutil) the
writer process spends per batched step, drain included (`_by_arm`: per cadence): it runs beside
training on a spare core, and adds to the step time on a machine with none (see
`loadavg_1m_before_after` and `cpu_cores`). The store is a fresh SQLite mlflow.db in a temporary
folder beside the output, deleted at the end.
"""
OUT_FILE = "tracking_overhead.json"
TARGET_RATIO = 1.01
TARGET_IN_THREAD_FRACTION = 0.01
ARMS = ("off", "batched", "off_default", "batched_default", "sync")
BATCHED = ("batched", "batched_default")


def _default_log_every() -> int:
    """params.yaml's train.log_every_steps (10 when there is no params.yaml here)."""
    path = repo_root() / "params.yaml"
    return int(yaml.safe_load(path.read_text())["train"]["log_every_steps"]) if path.is_file() else 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="timed steps per arm and repeat")
    parser.add_argument("--sync-steps", type=int, default=60, help="timed steps of the sync arm per repeat")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats of every arm (default: 7)")
    parser.add_argument("--warmup-steps", type=int, default=20, help="untimed steps before the repeats (default: 20)")
    parser.add_argument("--flush-every", type=int, default=50, help="steps between flushes (checkpoint cadence)")
    parser.add_argument("--features", type=int, default=256, help="input features of the MLP trained (default: 256)")
    parser.add_argument(
        "--hidden", type=int, nargs="+", default=[256, 256], help="the MLP's hidden layer widths (default: 256 256)"
    )
    parser.add_argument("--batch-size", type=int, default=128, help="start of the calibration")
    parser.add_argument("--target-step-ms", type=float, default=10.0, help="0: keep --batch-size")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads of the training (default: 1)")
    parser.add_argument(
        "--default-log-every",
        type=int,
        default=_default_log_every(),
        help="steps between logs in the *_default arms (default: params.yaml's train.log_every_steps, else 10)",
    )
    parser.add_argument("--stop-procs", type=int, default=2, help="gloo processes of the StopFlag arm (0: skip)")
    parser.add_argument("--stop-steps", type=int, default=200, help="steps per StopFlag arm and repeat")
    parser.add_argument(
        "--stop-every",
        type=int,
        default=SlurmConfig().stop_check_every_steps,
        help="steps between StopFlag checks (default: slurm.stop_check_every_steps' default)",
    )
    parser.add_argument("--stop-repeats", type=int, default=7, help="timed repeats of the StopFlag arms (default: 7)")
    parser.add_argument("--stop-batch", type=int, default=32, help="per-rank batch (train.batch_size)")


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
        self.tracker_ns: list[int] = []  # the last run's in-thread CPU time in tracker calls, per step

    def run(
        self, tracker: tracking.Tracker, steps: int, flush_every: int, first_step: int = 1, log_every: int = 1
    ) -> list[float]:
        """Times `steps` steps with `tracker`, logging every `log_every`; returns seconds per step."""
        meter = Meter(0, self.batch_size)
        times, self.tracker_ns = [], []
        for step in range(first_step, first_step + steps):
            start = time.perf_counter()
            meter.add(step, self.loop.step([self.batches[step % len(self.batches)]]))
            cpu_ns = 0
            if step % log_every == 0:
                window = meter.window(step, self.loop.device)
                cpu = time.thread_time_ns()
                tracker.log_metrics(window, step)
                cpu_ns = time.thread_time_ns() - cpu
            if step % flush_every == 0:
                cpu = time.thread_time_ns()
                tracker.flush(wait=False)
                cpu_ns += time.thread_time_ns() - cpu
            times.append(time.perf_counter() - start)
            self.tracker_ns.append(cpu_ns)
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
    from scalelab.tracking import runs

    client = runs.client(f"sqlite:///{store / 'mlflow.db'}")
    exp = tracking.experiment_id(client, "bench-tracking")
    bench = build_bench(args)
    bench.run(tracking.NullTracker(), args.warmup_steps, 10**9)
    trackers: dict[str, tracking.Tracker] = {
        "off": tracking.NullTracker(),
        "batched": tracking.MlflowTracker(
            client, client.create_run(exp, run_name="batched").info.run_id, writer_after_s=0
        ),
        "off_default": tracking.NullTracker(),
        "batched_default": tracking.MlflowTracker(
            client, client.create_run(exp, run_name="default").info.run_id, writer_after_s=0
        ),
        "sync": SyncTracker(client, client.create_run(exp, run_name="sync").info.run_id),
    }
    start = time.perf_counter()  # once per job: start the writer processes (side by side), store a first batch
    for arm in BATCHED:
        trackers[arm].log_metrics({"start": 0.0}, 0)
        trackers[arm].flush(wait=False)
    trackers["batched"].flush(wait=True)
    writer_start_s = time.perf_counter() - start
    trackers["batched_default"].flush(wait=True)
    raw: dict[str, Any] = {
        "times": {arm: [] for arm in ARMS},
        "tracker_ns": {arm: [] for arm in ARMS},
        "writer_cpu_s": {arm: [] for arm in BATCHED},
        "drain_s": [],
        "writer_start_s": writer_start_s,
        "batch_size": bench.batch_size,
        "loadavg_1m": [os.getloadavg()[0]],
    }
    writers = {arm: psutil.Process(trackers[arm].writer_pid) for arm in BATCHED}
    for rep in range(args.repeats):
        for arm in ARMS[rep % len(ARMS) :] + ARMS[: rep % len(ARMS)]:
            steps = args.sync_steps if arm == "sync" else args.steps
            log_every = args.default_log_every if arm.endswith("_default") else 1
            cpu_start_s = sum(writers[arm].cpu_times()[:2]) if arm in BATCHED else 0.0
            raw["times"][arm].append(bench.run(trackers[arm], steps, args.flush_every, 1 + rep * steps, log_every))
            raw["tracker_ns"][arm].append(bench.tracker_ns)
            start = time.perf_counter()
            trackers[arm].flush(wait=True)  # the writer is idle before the next arm starts
            if arm in BATCHED:
                raw["writer_cpu_s"][arm].append(sum(writers[arm].cpu_times()[:2]) - cpu_start_s)
            if arm == "batched":
                raw["drain_s"].append(time.perf_counter() - start)
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


def _in_thread(raw: dict[str, Any], arm: str, off_ms: float) -> dict[str, Any]:
    """The training thread's CPU time in tracker calls: per step (us) and as a fraction of `off`."""
    all_ns = [x for rep in raw["tracker_ns"][arm] for x in rep]
    mean_us = statistics.fmean(all_ns) / 1000.0
    return {
        "mean_us_per_step": mean_us,
        "median_us_per_step": statistics.median(all_ns) / 1000.0,
        "max_us": max(all_ns) / 1000.0,
        "fraction_of_off_step": mean_us / (1000.0 * off_ms),
        "repeat_mean_us_per_step": [statistics.fmean(r) / 1000.0 for r in raw["tracker_ns"][arm]],
    }


def summarize(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Medians, means, paired ratios with intervals (figures in ms) plus the method, for the JSON file."""
    times = raw["times"]
    med = {arm: [statistics.median(r) for r in reps] for arm, reps in times.items()}
    mean = {arm: [statistics.fmean(r) for r in reps] for arm, reps in times.items()}
    overhead = _paired_ratio(med, "batched")
    off_ms = {
        "batched": _ms(times["off"], statistics.median),
        "batched_default": _ms(times["off_default"], statistics.median),
    }
    writer_ms = {arm: 1000.0 * sum(raw["writer_cpu_s"][arm]) / (args.steps * args.repeats) for arm in BATCHED}
    in_thread = {arm: _in_thread(raw, arm, off_ms[arm]) for arm in BATCHED}
    ab = {"log_every_1": stats.ratio_figures(med["batched"], med["off"])}
    ab["log_every_default"] = stats.ratio_figures(med["batched_default"], med["off_default"])
    low, high = ab["log_every_default"]["ci95"]
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
        "steps_per_repeat": {arm: args.sync_steps if arm == "sync" else args.steps for arm in ARMS},
        "repeats": args.repeats,
        "flush_every_steps": args.flush_every,
        "default_log_every_steps": args.default_log_every,
        "store": "sqlite",
        "median_step_ms": {arm: _ms(reps, statistics.median) for arm, reps in times.items()},
        "mean_step_ms": {arm: _ms(reps, statistics.fmean) for arm, reps in times.items()},
        "repeat_median_step_ms": {arm: [1000.0 * x for x in xs] for arm, xs in med.items()},
        "repeat_mean_step_ms": {arm: [1000.0 * x for x in xs] for arm, xs in mean.items()},
        "in_thread": in_thread,
        "in_thread_fraction_log_every_1": in_thread["batched"]["fraction_of_off_step"],
        "target_in_thread_fraction": TARGET_IN_THREAD_FRACTION,
        "meets_in_thread_target": in_thread["batched"]["fraction_of_off_step"] <= TARGET_IN_THREAD_FRACTION,
        "ab": ab,
        "meets_default_ab_target": low <= 1.0 <= high,
        "overhead_ratio": overhead,
        "overhead_pct": 100.0 * (overhead - 1.0),
        "repeat_overhead_ratios": [a / o for a, o in zip(med["batched"], med["off"])],  # the spread: resolution
        "amortized_overhead_ratio": _paired_ratio(mean, "batched"),
        "sync_overhead_ratio": _paired_ratio(med, "sync"),
        "sync_log_metric_ms_median": 1000.0 * statistics.median(raw["log_metric_s"]),
        "batched_drain_ms_median": 1000.0 * statistics.median(raw["drain_s"]),
        "repeat_batched_drain_ms": [1000.0 * s for s in raw["drain_s"]],
        "writer_cpu_ms_per_step": writer_ms["batched"],
        "writer_cpu_ms_per_step_by_arm": writer_ms,
        "writer_cpu_fraction_of_off_step": writer_ms["batched"] / off_ms["batched"],
        "raw_writer_cpu_s": raw["writer_cpu_s"],
        "loadavg_1m_before_after": raw["loadavg_1m"],
        "cpu_cores": os.cpu_count(),
        "writer_start_s": raw["writer_start_s"],
        "target_overhead_ratio": TARGET_RATIO,
        "meets_target": overhead <= TARGET_RATIO,
        "stop_flag": raw.get("stop_flag"),
        "host": socket.gethostname(),
        "cpu": provenance.cpu_model(),
        "torch": torch.__version__,
    }


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Measures, writes `<out_dir>/tracking_overhead.json` and its summary lines; returns the JSON content."""
    out_dir.mkdir(parents=True, exist_ok=True)
    store = Path(tempfile.mkdtemp(prefix=".bench-tracking-", dir=out_dir))
    try:
        raw = measure(args, store)
        if args.stop_procs:
            kwargs = {"steps": args.stop_steps, "repeats": args.stop_repeats, "batch": args.stop_batch}
            kwargs["every"] = args.stop_every
            raw["stop_flag"] = stopflag_cost.measure(procs=args.stop_procs, hidden=args.hidden, work=store, **kwargs)
        result = summarize(raw, args)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    atomic_write_json(out_dir / OUT_FILE, result)
    write_summary(result, out_dir)
    return result


def write_summary(result: dict[str, Any], out_dir: Path) -> None:
    """One summary.md line per figure: in-thread cost, the two A/Bs, the StopFlag cost."""
    it = result["in_thread"]["batched"]
    stats.write_summary_line(
        out_dir,
        "tracking_in_thread",
        f"{it['mean_us_per_step']:.1f} us/step in tracker calls = {100 * it['fraction_of_off_step']:.3f}% of a "
        f"{result['median_step_ms']['off']:.2f} ms step at log_every_steps 1 (writer process "
        f"{result['writer_cpu_ms_per_step']:.3f} ms CPU/step beside it)",
        f"<= {100 * TARGET_IN_THREAD_FRACTION:.0f}%",
        result["meets_in_thread_target"],
    )
    for key, name, goal in (
        ("log_every_1", "tracking_ab_every_step", None),
        ("log_every_default", "tracking_ab_default", "95% CI includes 0%"),
    ):
        ab = result["ab"][key]
        low, high = ab["ci95"]
        every = 1 if key == "log_every_1" else result["default_log_every_steps"]
        figure = (
            f"batched/off step time {100 * (ab['median_ratio'] - 1):+.2f}% (95% CI {100 * (low - 1):+.2f}% to "
            f"{100 * (high - 1):+.2f}%) at log_every_steps {every}"
        )
        met = (low <= 1.0 <= high) if goal else None  # every step: reported; its goal is tracking_in_thread
        stats.write_summary_line(out_dir, name, figure, goal or "none (see tracking_in_thread)", met)
    sf = result["stop_flag"]
    if sf:
        low, high = sf["ab_ratio"]["ci95"]
        stats.write_summary_line(
            out_dir,
            "stop_flag_per_step",
            f"StopFlag.everywhere {sf['call_us_median']:.0f} us/call; A/B {100 * sf['cost_fraction_of_step']:+.2f}% "
            f"(95% CI {100 * (low - 1):+.2f}% to {100 * (high - 1):+.2f}%) of a {sf['plain_step_ms_median']:.2f} ms "
            f"ddp step ({sf['processes']} gloo processes); {sf['note']}",
            f"<= {100 * sf['threshold_fraction']:.0f}% of the step",
            not sf["shows"],
        )


def headline(result: dict, out: Path) -> str:
    """One line with the figures and their units."""
    med = result["median_step_ms"]
    return (
        f"tracking overhead: {result['overhead_pct']:+.2f}% median step time "
        f"(off {med['off']:.2f} ms, batched {med['batched']:.2f} ms, amortized ratio "
        f"{result['amortized_overhead_ratio']:.4f}; sync log_metric {med['sync']:.2f} ms/step, "
        f"{result['sync_log_metric_ms_median']:.2f} ms/call); in-thread "
        f"{result['in_thread']['batched']['mean_us_per_step']:.1f} us/step "
        f"({100 * result['in_thread_fraction_log_every_1']:.3f}%) -> {out / OUT_FILE}"
    )
