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
from scalelab.training.meter import Meter

METHOD = """\
One process, strategy single, Loop.step on the mlp workload, synthetic batches, the batch calibrated
to a ~`--target-step-ms` step. Arms interleaved in a rotating order each repeat: `off` (no-op
tracker), `batched` (the MLflow tracker as training uses it, log_every_steps 1, handed to the writer
process every `--flush-every` steps), `off_default`/`batched_default` (at `--default-log-every`),
`sync` (one MlflowClient.log_metric per metric and step). `in_thread`: the training thread's CPU in
the tracker calls (thread_time_ns), as a fraction of the `off` step (goal <= 1%). A/B: median over
repeats of batched/off with a bootstrap 95% interval. Writers start once (`writer_start_s`); each
batched arm's writer drains after it (`batched_drain_ms`, untimed); `writer_cpu_ms_per_step` by
psutil. Busy repeats retried or dropped; a fresh SQLite store. `metrics_per_step`: N metrics a step,
flush every 10 steps: in-thread CPU and time until stored per step. `stop_flag`: `--stop-procs` gloo
ddp ranks, arms plain and stop_flag (StopFlag.everywhere every `--stop-every` steps) interleaved:
the median of stop_flag/plain with its interval; `call_us` times the call alone.
"""
ARMS = ("off", "batched", "off_default", "batched_default", "sync")
BATCHED = ("batched", "batched_default")
IN_THREAD, AB_DEFAULT = Goal("<=", 0.01, "<= 1%"), Goal("contains", 1.0, "95% CI includes 0%")
STOP = Goal("<=", 0.01, "<= 1% of the step")


class SyncTracker(tracking.Tracker):
    """One synchronous `log_metric` call per metric, timing each call."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id, self.call_s = client, run_id, []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            start = time.perf_counter()
            self.client.log_metric(self.run_id, key, value, step=step)
            self.call_s.append(time.perf_counter() - start)

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


class Bench:
    """The mlp loop and its batches; `run` times steps with a tracker."""

    def __init__(self, rank: Any, batch_size: int) -> None:
        self.rank, self.batch_size, self.tracker_ns = rank, batch_size, []

    def run(self, tracker: Any, steps: int, flush_every: int, first_step: int = 1, log_every: int = 1) -> list[float]:
        """Seconds per step of `steps` steps with `tracker`, logging every `log_every`."""
        meter, loop, batches = Meter(0, self.batch_size), self.rank.loop, self.rank.batches
        times, self.tracker_ns = [], []
        for step in range(first_step, first_step + steps):
            start, cpu_ns = time.perf_counter(), 0
            meter.add(step, loop.step([batches[step % 2]]))
            if step % log_every == 0:
                window = meter.window(step, loop.device)
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


def build_bench(args: Any) -> Bench:
    """The mlp workload under strategy single, its batch calibrated."""
    spec = {"workload": "mlp", "model": {"hidden": args.hidden, "dropout": 0.0}, "input_shape": [args.features]}
    spec |= {"num_classes": 10, "strategy": "single", "optim": {"name": "sgd", "lr": 1e-3}, "threads": args.threads}
    batch = args.batch_size
    for _ in range(3 if args.target_step_ms > 0 else 0):  # step time is about linear in the batch
        times = Bench(harness.rank_loop({**spec, "batch": batch}), batch).run(tracking.NullTracker(), 30, 10**9)
        batch = max(8, min(1 << 16, round(batch * args.target_step_ms / (1000 * statistics.median(times[10:])))))
    return Bench(harness.rank_loop({**spec, "batch": batch}), batch)


def measure_arms(ctx: harness.Context, client: Any, exp: str) -> dict[str, Any]:
    """The interleaved repeats: per arm and repeat, step times (s) and the trackers' figures."""
    args = ctx.args
    bench = build_bench(args)
    bench.run(tracking.NullTracker(), args.warmup_steps, 10**9)
    new = lambda name: client.create_run(exp, run_name=name).info.run_id  # noqa: E731
    trackers = {arm: tracking.MlflowTracker(client, new(arm), writer_after_s=0) for arm in BATCHED}
    trackers |= {"off": tracking.NullTracker(), "off_default": tracking.NullTracker()}
    trackers["sync"] = SyncTracker(client, new("sync"))
    start = time.perf_counter()  # once per job: start the writer processes (side by side), store a first batch
    for arm in BATCHED:
        trackers[arm].log_metrics({"start": 0.0}, 0)
        trackers[arm].flush(wait=False)
    trackers["batched"].flush(wait=True)
    writer_start_s = time.perf_counter() - start
    trackers["batched_default"].flush(wait=True)
    writers = {arm: psutil.Process(trackers[arm].writer_pid) for arm in BATCHED}
    loads = [os.getloadavg()[0]]

    def take(rep: int) -> dict[str, Any]:
        got: dict[str, Any] = {"times": {}, "tracker_ns": {}, "writer_cpu_s": {}}
        for arm in ARMS[rep % len(ARMS) :] + ARMS[: rep % len(ARMS)]:
            steps = args.sync_steps if arm == "sync" else args.steps
            log_every = args.default_log_every if arm.endswith("_default") else 1
            cpu_s = sum(writers[arm].cpu_times()[:2]) if arm in BATCHED else 0.0
            got["times"][arm] = bench.run(trackers[arm], steps, args.flush_every, 1 + rep * steps, log_every)
            got["tracker_ns"][arm] = bench.tracker_ns
            start = time.perf_counter()
            trackers[arm].flush(wait=True)  # the writer is idle before the next arm starts
            if arm in BATCHED:
                got["writer_cpu_s"][arm] = sum(writers[arm].cpu_times()[:2]) - cpu_s
            if arm == "batched":
                got["drain_s"] = time.perf_counter() - start
        return got

    reps = harness.take_repeats(take, ctx.policy())
    for tracker in trackers.values():
        tracker.finish()
    raw = {
        key: {arm: [r[key][arm] for r in reps.kept] for arm in reps.kept[0][key]}
        for key in ("times", "tracker_ns", "writer_cpu_s")
    }
    raw |= {"drain_s": [r["drain_s"] for r in reps.kept], "writer_start_s": writer_start_s}
    raw["log_metric_s"] = trackers["sync"].call_s
    return {**raw, "batch_size": bench.batch_size, "loadavg_1m": loads + [os.getloadavg()[0]], "busy": reps}


def metric_curve(client: Any, exp: str, metrics: list[int], steps: int, repeats: int) -> dict[str, list[float]]:
    """The tracker's in-thread CPU (us/step) and store time (s/step) with N metrics a step."""
    tracker = tracking.MlflowTracker(client, client.create_run(exp, run_name="metrics").info.run_id, writer_after_s=0)
    tracker.log_metrics({"start": 0.0}, 0)
    tracker.flush(wait=False)
    tracker.flush(wait=True)  # the writer runs before the timing
    in_thread, store = [], []
    for n in metrics:
        cpu_us, store_s = [], []
        for rep in range(repeats):
            cpu_ns, start = 0, time.perf_counter()
            for step in range(1 + rep * steps, 1 + (rep + 1) * steps):
                values = {f"n{n}_m{i}": float(step + i) for i in range(n)}
                cpu = time.thread_time_ns()
                tracker.log_metrics(values, step)
                if step % 10 == 0:
                    tracker.flush(wait=False)
                cpu_ns += time.thread_time_ns() - cpu
            tracker.flush(wait=True)
            store_s.append((time.perf_counter() - start) / steps)
            cpu_us.append(cpu_ns / 1000.0 / steps)
        in_thread.append(statistics.median(cpu_us))
        store.append(statistics.median(store_s))
    tracker.finish()
    return {"metrics": metrics, "in_thread_us_per_step": in_thread, "store_s_per_step": store}


def stopflag_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """One StopFlag rank: rank 0's step times of both arms per repeat, and the check's call times."""
    rank = harness.rank_loop(spec)
    loop, batches, flag, call_s = rank.loop, rank.batches, StopFlag(), []

    def stop_flag(step: int) -> None:  # Loop.step, then the check every `every` steps, as job.py runs it
        loop.step([batches[step % 2]])
        if (step + 1) % spec["every"] == 0:
            call = time.perf_counter()
            flag.everywhere(rank.device)
            call_s.append(time.perf_counter() - call)

    for step in range(20):  # warm-up
        loop.step([batches[step % 2]])
    arms = {"plain": lambda step: loop.step([batches[step % 2]]), "stop_flag": stop_flag}

    def take(i: int) -> dict[str, list[float]]:  # one repeat of both arms, the order alternating
        order = list(arms) if i % 2 == 0 else list(arms)[::-1]
        return {a: t[0] for a, t in timed_repeats({a: arms[a] for a in order}, repeats=1, steps=spec["steps"]).items()}

    reps = harness.take_repeats(take, spec["busy"])
    dist.all_gather_object(None)  # every rank is past its last collective; exit without teardown
    times = {arm: [r[arm] for r in reps.kept] for arm in arms}
    return {"times": times, "call_s": call_s, **reps.json(), "is_main": rank.env.is_main}


def stop_flag_cost(ctx: harness.Context, hidden: list[int]) -> dict[str, Any]:
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
    shows = not STOP.met(cost)
    note = f"checked every {a.stop_every} steps" + (
        ", it still costs more than 1% of this step: raise slurm.stop_check_every_steps (each step more "
        "delays a preemption stop by one step)"
        if shows
        else " (slurm.stop_check_every_steps): under 1% of the step"
    )
    return {
        "processes": a.stop_procs, "check_every_steps": a.stop_every, "steps_per_repeat": a.stop_steps,
        "repeats": a.stop_repeats, "batch_size_per_rank": a.stop_batch, "hidden": hidden,
        "plain_step_ms_median": plain_ms, "call_us_median": call_us, "call_fraction_of_step": call_fraction,
        "ab_ratio": ratio, "cost_fraction_of_step": ratio["median_ratio"] - 1.0, "threshold_fraction": STOP.target,
        "shows": shows, "note": note, "raw_times_s": raw["times"], "dropped": raw["dropped"], "cost": cost,
    }  # fmt: skip


def measure(ctx: harness.Context) -> dict[str, Any]:
    from scalelab.tracking import runs

    args = ctx.args
    client = runs.client(f"sqlite:///{ctx.work / 'mlflow.db'}")
    exp = tracking.experiment_id(client, "bench-tracking")
    raw = measure_arms(ctx, client, exp)
    metrics = [m for m in args.metrics if m > 0]
    curve = metric_curve(client, exp, metrics, args.metric_steps, args.metric_repeats) if metrics else None
    stop = stop_flag_cost(ctx, args.hidden) if args.stop_procs else None
    times, busy = raw["times"], raw["busy"]
    med = {arm: [statistics.median(r) for r in reps] for arm, reps in times.items()}
    mean = {arm: [statistics.fmean(r) for r in reps] for arm, reps in times.items()}
    ms = lambda reps, stat: 1000.0 * stat([x for rep in reps for x in rep])  # noqa: E731
    off_ms = {arm: ms(times[arm.replace("batched", "off")], statistics.median) for arm in BATCHED}
    n_steps = args.steps * len(busy.kept)
    writer_ms = {arm: 1000.0 * sum(raw["writer_cpu_s"][arm]) / n_steps for arm in BATCHED}
    in_thread = {}
    for arm in BATCHED:
        all_ns = [x for rep in raw["tracker_ns"][arm] for x in rep]
        mean_us = statistics.fmean(all_ns) / 1000.0
        in_thread[arm] = {
            "mean_us_per_step": mean_us, "median_us_per_step": statistics.median(all_ns) / 1000.0,
            "max_us": max(all_ns) / 1000.0, "fraction_of_off_step": mean_us / (1000.0 * off_ms[arm]),
            "repeat_mean_us_per_step": [statistics.fmean(r) / 1000.0 for r in raw["tracker_ns"][arm]],
        }  # fmt: skip
    ab = {"log_every_1": stats.ratio_figures(med["batched"], med["off"])}
    ab["log_every_default"] = stats.ratio_figures(med["batched_default"], med["off_default"])
    overhead, fraction = stats.median_ratio(med["batched"], med["off"]), in_thread["batched"]["fraction_of_off_step"]
    result = {
        "workload": {"name": "mlp", "features": args.features, "hidden": args.hidden, "batch_size": raw["batch_size"],
                     "strategy": "single", "device": "cpu", "threads": args.threads,
                     "target_step_ms": args.target_step_ms},
        "steps_per_repeat": {arm: args.sync_steps if arm == "sync" else args.steps for arm in ARMS},
        "repeats": args.repeats, "flush_every_steps": args.flush_every,
        "default_log_every_steps": args.default_log_every, "store": "sqlite",
        "median_step_ms": {arm: ms(reps, statistics.median) for arm, reps in times.items()},
        "mean_step_ms": {arm: ms(reps, statistics.fmean) for arm, reps in times.items()},
        "repeat_median_step_ms": {arm: [1000.0 * x for x in xs] for arm, xs in med.items()},
        "repeat_mean_step_ms": {arm: [1000.0 * x for x in xs] for arm, xs in mean.items()},
        "in_thread": in_thread, "in_thread_fraction_log_every_1": fraction,
        "target_in_thread_fraction": IN_THREAD.target, "meets_in_thread_target": IN_THREAD.met(fraction),
        "ab": ab, "meets_default_ab_target": AB_DEFAULT.met(ab["log_every_default"]["ci95"]),
        "overhead_ratio": overhead, "overhead_pct": 100.0 * (overhead - 1.0),
        "repeat_overhead_ratios": [a / o for a, o in zip(med["batched"], med["off"])],
        "amortized_overhead_ratio": stats.median_ratio(mean["batched"], mean["off"]),
        "sync_overhead_ratio": stats.median_ratio(med["sync"], med["off"]),
        "sync_log_metric_ms_median": 1000.0 * statistics.median(raw["log_metric_s"]),
        "batched_drain_ms_median": 1000.0 * statistics.median(raw["drain_s"]),
        "repeat_batched_drain_ms": [1000.0 * s for s in raw["drain_s"]],
        "writer_cpu_ms_per_step": writer_ms["batched"], "writer_cpu_ms_per_step_by_arm": writer_ms,
        "writer_cpu_fraction_of_off_step": writer_ms["batched"] / off_ms["batched"],
        "raw_writer_cpu_s": raw["writer_cpu_s"], "loadavg_1m_before_after": raw["loadavg_1m"],
        "writer_start_s": raw["writer_start_s"], "target_overhead_ratio": 1.01, "meets_target": overhead <= 1.01,
        **busy.json(), "metrics_per_step": curve, "stop_flag": stop, "torch": torch.__version__,
    }  # fmt: skip
    it = in_thread["batched"]
    ctx.figure(
        "tracking_in_thread",
        f"{it['mean_us_per_step']:.1f} us/step in tracker calls = {100 * fraction:.3f}% of a "
        f"{result['median_step_ms']['off']:.2f} ms step at log_every_steps 1 (writer process "
        f"{writer_ms['batched']:.3f} ms CPU/step beside it)",
        fraction, IN_THREAD, dropped=busy.dropped,
    )  # fmt: skip
    for key, name, goal in (
        ("log_every_1", "tracking_ab_every_step", Goal("none", text="none (see tracking_in_thread)")),
        ("log_every_default", "tracking_ab_default", AB_DEFAULT),
    ):
        every = 1 if key == "log_every_1" else args.default_log_every
        text = f"batched/off step time {stats.ratio_text(ab[key], pct=True)} at log_every_steps {every}"
        ctx.figure(name, text, ab[key]["ci95"], goal, dropped=busy.dropped)
    if stop:
        text = (
            f"StopFlag.everywhere {stop['call_us_median']:.0f} us/call; "
            f"A/B {stats.ratio_text(stop['ab_ratio'], pct=True)} of a {stop['plain_step_ms_median']:.2f} ms "
            f"ddp step ({stop['processes']} gloo processes); {stop['note']}"
        )
        ctx.figure("stop_flag_per_step", text, stop["cost"], STOP, dropped=stop["dropped"])
    return result


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
