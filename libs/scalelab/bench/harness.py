"""The one benchmark harness: a `Benchmark` declaration (name, JSON file, method, options, `measure(ctx) -> dict`),
ranks from a spec (`ctx.ranks`, launch.local.run_ranks; inside a rank `rank_loop` builds the Loop and two synthetic
batches), `take_repeats` (study.busy: a busy repeat is retried, then dropped and counted in the figure's line) and
`ctx.figure` (a goal and a computed verdict)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.bench import stats
from scalelab.bench.stats import Goal
from scalelab.config import SpeedupConfig, strategies
from scalelab.launch.local import LaunchError, run_ranks
from scalelab.runtime import dist, disturbance
from scalelab.runtime.io import atomic_write_json
from scalelab.study import busy


def opt(flag: str, default: Any, help: str, **kw: Any) -> tuple[str, dict[str, Any]]:
    """An option of a benchmark; its type (and nargs "+" for a list) follows the default."""
    if isinstance(default, bool):
        return flag, {"action": "store_true", "help": help, **kw}
    sample = default[0] if isinstance(default, list) and default else default
    kind = kw.pop("type", type(sample) if sample is not None else str)
    nargs = {"nargs": "+"} if isinstance(default, list) else {}
    return flag, {"default": default, "type": kind, "help": f"{help} (default: {default})", **nargs, **kw}


@dataclass(frozen=True)
class Benchmark:
    name: str  # `scalelab bench NAME`
    out_file: str  # under --out
    method: str  # how it measures: the JSON file carries it
    measure: Callable[[Context], dict[str, Any]]
    options: tuple[tuple[str, dict[str, Any]], ...] = ()
    key: str = ""  # the JSON's "benchmark" (default: name)
    scratch_outside: bool = False  # scratch folder in the system's temporary folder, not under --out

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        for flag, kw in self.options:
            parser.add_argument(flag, **kw)
        share, retries = SpeedupConfig().max_others_cpu_share, SpeedupConfig().max_retries
        busy_help = "a repeat while other processes held more of the cores is busy: retried, then dropped"
        parser.add_argument("--max-busy-share", type=float, default=share, help=f"{busy_help} (default: {share})")
        parser.add_argument("--max-retries", type=int, default=retries, help=f"extra repeats (default: {retries})")

    def defaults(self) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        self.add_arguments(parser)
        return parser.parse_args([])


class Failed(RuntimeError):
    """A benchmark measured, and its figures say something is wrong; its JSON is written first."""

    exit_status = 1

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class Context:
    bench: Benchmark
    args: argparse.Namespace
    out: Path
    work: Path
    lines: list[str] = field(default_factory=list)

    def figure(self, name: str, text: str, value: Any, goal: Goal, *, also: bool = True, dropped: list | None = None):
        """Writes and prints figure `name`'s summary line; it counts the `dropped` busy repeats."""
        if dropped is not None:
            text += f"; {len(dropped)} busy repeat{'s' * (len(dropped) != 1)} dropped"
            text += f" ({busy.dropped_summary(dropped)})" if dropped else ""
        line = stats.write_figure(self.out, name, text, value, goal, also)
        self.lines.append(line)
        print(line, flush=True)

    def policy(self, repeats: int | None = None) -> dict[str, Any]:
        """The busy-repeat policy (study.busy.Policy's fields) for `repeats` kept repeats."""
        n = self.args.repeats if repeats is None else repeats
        return {"repeats": n, "max_share": self.args.max_busy_share, "max_retries": self.args.max_retries}

    def ranks(self, worker: str, spec: dict[str, Any], name: str, *, nproc: int | None, threads: int = 1) -> dict:
        """`scalelab bench-worker WORKER` on `spec` (`nproc` torchrun ranks, None: one process): rank 0's result."""
        try:
            return run_ranks(["bench-worker", worker], spec, self.work, name, nproc=nproc, threads_per_process=threads)
        except LaunchError as exc:
            raise LaunchError(f"{self.bench.name} benchmark, {name} ranks: {exc}") from exc


def ranks_of(strategy: str, nproc: int) -> int | None:
    """Ranks under torchrun for a distributed strategy; None: one plain process."""
    return nproc if strategies.get(strategy).distributed else None


def rotated(arms: Iterable[str], i: int) -> list[str]:
    """The arms in repeat `i`'s order: rotated by `i`, so each leads in turn (two arms alternate)."""
    arms = list(arms)
    return arms[i % len(arms) :] + arms[: i % len(arms)]


def timed(work: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """Wall seconds of `work(*args, **kwargs)`."""
    start = time.perf_counter()
    work(*args, **kwargs)
    return time.perf_counter() - start


def run(bench: Benchmark, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Measures in a scratch folder (removed after); writes and returns `<out>/<out_file>`."""
    out = Path(out).absolute()  # scratch folders and stores are used from other working folders
    out.mkdir(parents=True, exist_ok=True)
    print(f"scalelab bench {bench.name}: measuring", flush=True)
    where = {"prefix": f"scalelab-bench-{bench.name}-"} if bench.scratch_outside else {"prefix": ".bench-", "dir": out}
    work = Path(tempfile.mkdtemp(**where)).resolve()
    ctx = Context(bench, args, out, work)
    failed = None
    try:
        result = bench.measure(ctx)
    except Failed as exc:
        result, failed = exc.result, exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {**stats.machine(), "benchmark": bench.key or bench.name, "method": bench.method.strip(), **result}
    atomic_write_json(out / bench.out_file, result)
    print(f"scalelab bench {bench.name}: {len(ctx.lines)} figures -> {out / bench.out_file}", flush=True)
    if failed:
        raise failed
    return json.loads(json.dumps(result))


# ---- repeats, in a rank or in the benchmark's own process ----


class MachineBusy(RuntimeError):
    """Every repeat was busy (retries included): the benchmark states no figure."""


@dataclass
class Repeats:
    kept: list[Any]  # each kept repeat's value
    disturbance: list[dict[str, float]]  # what the others took during each kept repeat
    dropped: list[dict[str, Any]]  # busy repeats: their shares and reason

    def json(self) -> dict[str, Any]:
        return {"disturbance": self.disturbance, "dropped": self.dropped}


def _snapshot(pids: list[int]) -> disturbance.Snapshot:
    """runtime.disturbance's snapshot; ours: `pids`, their descendants and this process's reaped children."""
    import psutil

    ours = set(pids)
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            ours.update(child.pid for child in psutil.Process(pid).children(recursive=True))
    snap = disturbance.snapshot(sorted(ours))
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = round((kids.ru_utime + kids.ru_stime) * disturbance.HZ)
    return dataclasses.replace(snap, own_ticks=snap.own_ticks + reaped)


def take_repeats(take: Callable[[int], Any], policy: dict[str, Any]) -> Repeats:
    """`take(i)` on every rank until `policy["repeats"]` were kept, busy ones (rank 0's measure)
    retried, then dropped; a collective. MachineBusy when none was kept."""
    env, ours = dist.read_env(), dist.all_gather_object(os.getpid())
    values: list[Any] = []

    def turn(_: str) -> dict[str, Any]:
        before = _snapshot(ours) if env.is_main else None
        values.append(take(len(values)))
        took = disturbance.share(before, _snapshot(ours), os.cpu_count() or 1).as_dict() if env.is_main else None
        return {"index": len(values) - 1, **dist.broadcast_object(took)}

    tally = busy.take_rounds(["bench"], turn, busy.Policy(**policy))["bench"]
    if not tally.kept:  # no figure: the machine was busy through every repeat (the study's "invalid")
        raise MachineBusy(busy.all_dropped(tally))
    dropped = [{**busy.share_of(d), "reason": d["reason"], "max_share": d["max_share"]} for d in tally.dropped]
    return Repeats([values[r["index"]] for r in tally.kept], [busy.share_of(r) for r in tally.kept], dropped)


def rank_loop(spec: dict[str, Any], **loop_kw: Any) -> Any:
    """Process set-up, `spec`'s workload, its Loop and two synthetic batches seeded per rank (env,
    device, wl, loop, batches)."""
    import torch

    from scalelab.runtime import seeds
    from scalelab.runtime.device import setup_process
    from scalelab.training import workloads
    from scalelab.training.loop import Optim, build_loop

    env, seed = dist.read_env(), spec.get("seed", 0)
    process = {"device": "cpu", "threads": 1, "deterministic": False, "timeout_s": 120.0}
    device = setup_process(env, **{k: spec.get(k, default) for k, default in process.items()})
    seeds.seed_all(seed)
    shape, classes = spec["input_shape"], spec["num_classes"]
    wl = workloads.load(spec["workload"], spec["model"], input_shape=shape, num_classes=classes, key="bench")
    precision, optim = spec.get("precision", "fp32"), Optim(**spec["optim"])
    loop = build_loop(wl, device, strategy_name=spec["strategy"], precision=precision, optim=optim, **loop_kw)
    n, gen = spec["batch"], torch.Generator().manual_seed(seeds.rank_seed(seed, env.rank))
    if wl.synthetic_batch:
        batches = [wl.synthetic_batch(n, device=device, generator=gen) for _ in range(2)]
    else:
        pairs = [(torch.randn(n, *shape, generator=gen), torch.randint(classes, (n,), generator=gen)) for _ in range(2)]
        batches = [(x.to(device), y.to(device)) for x, y in pairs]
    return argparse.Namespace(env=env, device=device, wl=wl, loop=loop, batches=batches)
