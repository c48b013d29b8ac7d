"""What experiment tracking costs a training step (off against on, and against the metrics logged
a step), and what `StopFlag.everywhere` costs a DDP step (ranks: `bench-worker stopflag`)."""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import psutil
import torch
import yaml

from scalelab import tracking
from scalelab.bench import harness, stats
from scalelab.bench.harness import Goal, opt
from scalelab.config.schema import SlurmConfig
from scalelab.runtime import dist
from scalelab.runtime.paths import repo_root
from scalelab.runtime.repeats import timed_repeats
from scalelab.runtime.signals import StopFlag
from scalelab.tracking import runs
from scalelab.training.meter import Meter

METHOD = """\
One process, strategy single, Loop.step on the mlp workload (synthetic batches, the batch calibrated to a
~`--target-step-ms` step). Arms interleaved, the order rotating each repeat: `off` (no-op tracker), `batched` (the
MLflow tracker as training uses it: log every step, hand to the writer process every `--flush-every` steps),
`off_default`/`batched_default` (log every `--default-log-every`), `sync` (one MlflowClient.log_metric per metric).
`in_thread`: the training thread's CPU in the tracker calls (thread_time_ns) as a fraction of the `off` step.
`writer_start_s`: batched's writer starting and storing a first batch; each writer drains after its arm, untimed;
writer CPU by psutil. `metrics_per_step`: N metrics a step, flush every 10 steps: in-thread CPU and time until stored
per step. `stop_flag`: `--stop-procs` gloo ddp ranks, plain and stop_flag (StopFlag.everywhere every `--stop-every`
steps) interleaved; `call_us` times the call alone. A/B (batched/off, stop_flag/plain): median over repeats with a
bootstrap 95% interval. Busy repeats retried or dropped; a fresh SQLite store.
"""
ARMS = ("off", "batched", "off_default", "batched_default", "sync")
BATCHED = ("batched", "batched_default")
IN_THREAD, AB_DEFAULT = Goal("<=", 0.01, "<= 1%"), Goal("contains", 1.0, "95% CI includes 0%")
STOP = Goal("<=", 0.01, "<= 1% of the step")
STOP_FINE = " (slurm.stop_check_every_steps): under 1% of the step"
STOP_ADVICE = ", it still costs more than 1% of this step: raise slurm.stop_check_every_steps (each step more delays a "
STOP_ADVICE += "preemption stop by one step)"


class SyncTracker(tracking.Tracker):
    """One synchronous `log_metric` call per metric, timing each call (its run is left open: the store is scratch)."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id, self.call_s = client, run_id, []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.call_s.append(harness.timed(self.client.log_metric, self.run_id, key, value, step=step))


def tracker_calls(tracker: Any, metrics: dict[str, float] | None, step: int, flush_every: int) -> int:
    """The training thread's CPU (ns) in logging `metrics` (None: not this step) and flushing every `flush_every`."""
    cpu = time.thread_time_ns()
    if metrics is not None:
        tracker.log_metrics(metrics, step)
    if step % flush_every == 0:
        tracker.flush(wait=False)
    return time.thread_time_ns() - cpu


def run_steps(rank: Any, tracker: Any, steps: int, flush_every: int, first: int = 1, log_every: int = 1) -> tuple:
    """`steps` steps of `rank`'s loop logging to `tracker` every `log_every`: each step's seconds, and
    the training thread's CPU (ns) in its tracker calls."""
    meter, loop, times, cpu_ns = Meter(0, len(rank.batches[0][1])), rank.loop, [], []
    for step in range(first, first + steps):
        start = time.perf_counter()
        meter.add(step, loop.step([rank.batches[step % 2]]))
        window = meter.window(step, loop.device) if step % log_every == 0 else None
        cpu_ns.append(tracker_calls(tracker, window, step, flush_every))
        times.append(time.perf_counter() - start)
    return times, cpu_ns


def build_rank(args: Any) -> Any:
    """The mlp workload under strategy single (harness.rank_loop), its batch calibrated."""
    spec = {"workload": "mlp", "model": {"hidden": args.hidden, "dropout": 0.0}, "input_shape": [args.features]}
    spec |= {"num_classes": 10, "strategy": "single", "optim": {"name": "sgd", "lr": 1e-3}, "threads": args.threads}
    batch = args.batch_size
    for _ in range(3 if args.target_step_ms > 0 else 0):  # step time is about linear in the batch
        times, _ = run_steps(harness.rank_loop({**spec, "batch": batch}), tracking.NullTracker(), 30, 10**9)
        batch = max(8, min(1 << 16, round(batch * args.target_step_ms / (1000 * statistics.median(times[10:])))))
    return harness.rank_loop({**spec, "batch": batch})


def started(client: Any, exp: str, name: str) -> tuple[tracking.MlflowTracker, float]:
    """A new run's tracker whose writer process started and stored a first batch, and the seconds that took."""
    tracker = tracking.MlflowTracker(client, client.create_run(exp, run_name=name).info.run_id, writer_after_s=0)
    start = time.perf_counter()
    tracker.log_metrics({"start": 0.0}, 0)
    tracker.flush(wait=False)  # starts the writer
    tracker.flush(wait=True)
    return tracker, time.perf_counter() - start


def measure_arms(ctx: harness.Context, client: Any, exp: str) -> dict[str, Any]:
    """The interleaved repeats of every arm: their figures (in-thread CPU, A/B, writer) and summary lines."""
    args, rank = ctx.args, build_rank(ctx.args)
    run_steps(rank, tracking.NullTracker(), args.warmup_steps, 10**9)
    (batched, writer_start_s), (batched_default, _) = (started(client, exp, arm) for arm in BATCHED)
    sync = SyncTracker(client, client.create_run(exp, run_name="sync").info.run_id)
    trackers = dict(zip(ARMS, (tracking.NullTracker(), batched, tracking.NullTracker(), batched_default, sync)))
    steps = {arm: args.sync_steps if arm == "sync" else args.steps for arm in ARMS}
    writers, loadavg = {arm: psutil.Process(trackers[arm].writer_pid) for arm in BATCHED}, os.getloadavg()[0]
    writer_s = lambda arm: sum(writers[arm].cpu_times()[:2]) if arm in writers else 0.0  # noqa: E731  (CPU s)

    def take(rep: int) -> dict[str, dict[str, Any]]:  # arm -> times (s), tracker CPU (ns), drain and writer CPU (s)
        got = {}
        for arm in harness.rotated(ARMS, rep):
            before, log_every = writer_s(arm), args.default_log_every if arm.endswith("_default") else 1
            times, ns = run_steps(rank, trackers[arm], steps[arm], args.flush_every, 1 + rep * steps[arm], log_every)
            drain_s = harness.timed(trackers[arm].flush, wait=True)  # the writer is idle before the next arm starts
            got[arm] = {"times": times, "tracker_ns": ns, "drain_s": drain_s, "writer_cpu_s": writer_s(arm) - before}
        return got

    busy = harness.take_repeats(take, ctx.policy())
    for tracker in trackers.values():
        tracker.finish()
    raw = {key: {arm: [r[arm][key] for r in busy.kept] for arm in ARMS} for key in busy.kept[0]["off"]}
    med = {arm: [statistics.median(r) for r in reps] for arm, reps in raw["times"].items()}
    step_ms = {arm: 1000.0 * statistics.median([x for r in reps for x in r]) for arm, reps in raw["times"].items()}
    writer_ms = {arm: 1000.0 * sum(raw["writer_cpu_s"][arm]) / (args.steps * len(busy.kept)) for arm in BATCHED}
    in_thread = {}
    for arm in BATCHED:
        us, off_ms = [x / 1000.0 for r in raw["tracker_ns"][arm] for x in r], step_ms[arm.replace("batched", "off")]
        in_thread[arm] = {
            "mean_us_per_step": statistics.fmean(us), "median_us_per_step": statistics.median(us), "max_us": max(us),
            "fraction_of_off_step": statistics.fmean(us) / (1000.0 * off_ms),
            "repeat_mean_us_per_step": [statistics.fmean(r) / 1000.0 for r in raw["tracker_ns"][arm]],
        }  # fmt: skip
    mine = in_thread["batched"]
    text = f"{mine['mean_us_per_step']:.1f} us/step in tracker calls = {100 * mine['fraction_of_off_step']:.3f}% of a "
    text += f"{step_ms['off']:.2f} ms step at log_every_steps 1 (writer process {writer_ms['batched']:.3f} ms CPU/step "
    ctx.figure("tracking_in_thread", text + "beside it)", mine["fraction_of_off_step"], IN_THREAD, dropped=busy.dropped)
    ab = {}
    for key, name, goal, every, arm in (
        ("log_every_1", "tracking_ab_every_step", Goal("none", text="none (see tracking_in_thread)"), 1, ""),
        ("log_every_default", "tracking_ab_default", AB_DEFAULT, args.default_log_every, "_default"),
    ):
        ab[key] = stats.ratio_figures(med[f"batched{arm}"], med[f"off{arm}"])
        text = f"batched/off step time {stats.ratio_text(ab[key], pct=True)} at log_every_steps {every}"
        ctx.figure(name, text, ab[key]["ci95"], goal, dropped=busy.dropped)
    return {
        "workload": {"name": "mlp", "strategy": "single", "device": "cpu", "batch_size": len(rank.batches[0][1]),
                     **{k: getattr(args, k) for k in ("features", "hidden", "threads", "target_step_ms")}},
        "steps_per_repeat": steps, "repeats": args.repeats, "flush_every_steps": args.flush_every,
        "default_log_every_steps": args.default_log_every, "median_step_ms": step_ms,
        "repeat_median_step_ms": {arm: [1000.0 * x for x in xs] for arm, xs in med.items()}, "in_thread": in_thread,
        "ab": ab, "sync_overhead_ratio": stats.median_ratio(med["sync"], med["off"]),
        "sync_log_metric_ms_median": 1000.0 * statistics.median(sync.call_s), "writer_start_s": writer_start_s,
        "repeat_batched_drain_ms": [1000.0 * s for s in raw["drain_s"]["batched"]], **busy.json(),
        "writer_cpu_ms_per_step_by_arm": writer_ms, "loadavg_1m_before_after": [loadavg, os.getloadavg()[0]],
        "raw_writer_cpu_s": {arm: raw["writer_cpu_s"][arm] for arm in BATCHED},
    }  # fmt: skip


def metric_curve(client: Any, exp: str, args: Any) -> dict[str, list[float]] | None:
    """The tracker's in-thread CPU (us/step) and store time (s/step) with N metrics a step (None: no N > 0)."""
    metrics, steps = [m for m in args.metrics if m > 0], args.metric_steps
    if not metrics:
        return None
    tracker, _ = started(client, exp, "metrics")  # the writer runs before the timing
    curve = {"metrics": metrics, "in_thread_us_per_step": [], "store_s_per_step": []}
    for n in metrics:
        cpu_us, store_s = [], []
        for rep in range(args.metric_repeats):
            cpu_ns, start = 0, time.perf_counter()
            for step in range(1 + rep * steps, 1 + (rep + 1) * steps):
                cpu_ns += tracker_calls(tracker, {f"n{n}_m{i}": float(step + i) for i in range(n)}, step, 10)
            tracker.flush(wait=True)
            store_s.append((time.perf_counter() - start) / steps)
            cpu_us.append(cpu_ns / 1000.0 / steps)
        curve["in_thread_us_per_step"].append(statistics.median(cpu_us))
        curve["store_s_per_step"].append(statistics.median(store_s))
    tracker.finish()
    return curve


def stopflag_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """One StopFlag rank: rank 0's step times of both arms per repeat, and the check's call times."""
    rank = harness.rank_loop(spec)
    loop, batches, flag, call_s = rank.loop, rank.batches, StopFlag(), []

    def stop_flag(step: int) -> None:  # Loop.step, then the check every `every` steps, as job.py runs it
        loop.step([batches[step % 2]])
        if (step + 1) % spec["every"] == 0:
            call_s.append(harness.timed(flag.everywhere, rank.device))

    for step in range(20):  # warm-up
        loop.step([batches[step % 2]])
    arms = {"plain": lambda step: loop.step([batches[step % 2]]), "stop_flag": stop_flag}

    def take(i: int) -> dict[str, list[float]]:  # one repeat of both arms, the order alternating
        order = harness.rotated(arms, i)
        return {a: t[0] for a, t in timed_repeats({a: arms[a] for a in order}, repeats=1, steps=spec["steps"]).items()}

    reps = harness.take_repeats(take, spec["busy"])
    dist.all_gather_object(None)  # every rank is past its last collective; exit without teardown
    times = {arm: [r[arm] for r in reps.kept] for arm in arms}
    return {"times": times, "call_s": call_s, **reps.json(), "is_main": rank.env.is_main}


def stop_flag_cost(ctx: harness.Context, hidden: list[int]) -> dict[str, Any]:
    """The `stop_flag` block and its summary line: StopFlag.everywhere's cost on `--stop-procs` gloo ddp ranks."""
    a = ctx.args
    spec = {"workload": "mlp", "model": {"hidden": hidden, "dropout": 0.0}, "input_shape": [64], "num_classes": 10}
    spec |= {"strategy": "ddp", "optim": {"name": "adamw", "lr": 1e-3}, "batch": a.stop_batch, "steps": a.stop_steps}
    spec |= {"every": a.stop_every, "busy": ctx.policy(a.stop_repeats), "timeout_s": 120.0}
    raw = ctx.ranks("stopflag", spec, "stop", nproc=a.stop_procs)
    med = {arm: [stats.median(rep) for rep in reps] for arm, reps in raw["times"].items()}
    ratio = stats.ratio_figures(med["stop_flag"], med["plain"])
    call_us, plain_ms = 1e6 * stats.median(raw["call_s"]), 1000.0 * stats.median(med["plain"])
    call_fraction = call_us / (1000.0 * plain_ms)
    cost = max(ratio["median_ratio"] - 1.0, call_fraction)
    note = f"checked every {a.stop_every} steps" + (STOP_ADVICE if not STOP.met(cost) else STOP_FINE)
    text = f"StopFlag.everywhere {call_us:.0f} us/call; A/B {stats.ratio_text(ratio, pct=True)} of a {plain_ms:.2f} ms "
    text += f"ddp step ({a.stop_procs} gloo processes); {note}"
    ctx.figure("stop_flag_per_step", text, cost, STOP, dropped=raw["dropped"])
    return {
        "processes": a.stop_procs, "check_every_steps": a.stop_every, "steps_per_repeat": a.stop_steps,
        "repeats": a.stop_repeats, "batch_size_per_rank": a.stop_batch, "hidden": hidden,
        "plain_step_ms_median": plain_ms, "call_us_median": call_us, "call_fraction_of_step": call_fraction,
        "ab_ratio": ratio, "note": note, "cost": cost, "raw_times_s": raw["times"], "dropped": raw["dropped"],
    }  # fmt: skip


def measure(ctx: harness.Context) -> dict[str, Any]:
    args = ctx.args
    client = runs.client(f"sqlite:///{ctx.work / 'mlflow.db'}")
    exp = tracking.experiment_id(client, "bench-tracking")
    result = measure_arms(ctx, client, exp) | {"metrics_per_step": metric_curve(client, exp, args)}
    result["stop_flag"] = stop_flag_cost(ctx, args.hidden) if args.stop_procs else None
    return {**result, "torch": torch.__version__}


def _default_log_every() -> int:  # params.yaml's train.log_every_steps (10 without one)
    path = repo_root() / "params.yaml"
    return int(yaml.safe_load(path.read_text())["train"]["log_every_steps"]) if path.is_file() else 10


OPTIONS = (
    opt("--steps", 300, "timed steps per arm and repeat"),
    opt("--sync-steps", 60, "timed steps of the sync arm per repeat"),
    opt("--repeats", 7, "timed repeats of every arm"),
    opt("--warmup-steps", 20, "untimed steps before the repeats"),
    opt("--flush-every", 50, "steps between flushes (checkpoint cadence)"),
    opt("--features", 256, "input features of the MLP trained"),
    opt("--hidden", [256, 256], "the MLP's hidden layer widths"),
    opt("--batch-size", 128, "start of the calibration"),
    opt("--target-step-ms", 10.0, "0: keep --batch-size"),
    opt("--threads", 1, "torch CPU threads of the training"),
    opt("--default-log-every", _default_log_every(), "steps between logs in the *_default arms"),
    opt("--metrics", [1, 10, 100, 1000], "metrics per step of the tracker's cost curve (0: skip)"),
    opt("--metric-steps", 30, "logged steps per metric count and repeat"),
    opt("--metric-repeats", 3, "repeats per metric count (their median)"),
    opt("--stop-procs", 2, "gloo processes of the StopFlag arm (0: skip)"),
    opt("--stop-steps", 200, "steps per StopFlag arm and repeat"),
    opt("--stop-every", SlurmConfig().stop_check_every_steps, "steps between StopFlag checks"),
    opt("--stop-repeats", 7, "timed repeats of the StopFlag arms"),
    opt("--stop-batch", 32, "per-rank batch (train.batch_size)"),
)
BENCH = harness.Benchmark("tracking", "tracking_overhead.json", METHOD, measure, OPTIONS, key="tracking_overhead")
