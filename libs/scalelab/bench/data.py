"""Data at scale: prepare, start-up check, per-rank memory and loader wait against the data's size
(ranks: `bench-worker data`)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.bench import harness, loader, pipeline
from scalelab.bench.harness import Goal, opt, timed
from scalelab.bench.scaling import fit
from scalelab.config import TrainConfig, build
from scalelab.data import arrays
from scalelab.data.store import open_split, verify
from scalelab.runtime import dist, memory
from scalelab.training.loader import RunLoader
from scalelab.training.plan import RunPlan
from scalelab.training.sampler import RankBatches

METHOD = """\
Per size (text as byte tokens, 1 MB files cut from the standard library's .py files): `prepare` (data.source text) in
a fresh process, timed after its imports, its peak memory the VmHWM above its start; `verify` and `verify(full=True)`
timed once, files in the page cache; a DDP job of gloo ranks, each fetching every sample of its share of the mapped
split once, then training the GPT workload with training's RunLoader per num_workers arm and repeat, arms interleaved
(busy repeats retried, then dropped). Per-rank RssAnon after the full pass and after the steps; loader wait: wait /
(wait + compute) over a repeat on the rank that waited most, median over repeats. Slopes: least squares of
log(figure) on log(size). A sparse 10 GB token file (no disk used) is checked as start-up checks it. `csv_rows`:
`prepare` of CSVs of R rows x 32 features + label (data.source file), each in a fresh process the same way.
"""
RSS, PREPARE, PEAK, VERIFY = Goal("<", 0.1), Goal("<=", 1.1), Goal("<", 0.1, "< 0.1 (bounded)"), Goal("<", 2.0, "< 2 s")
GPT = {"vocab_size": 256, "seq_len": 64, "d_model": 64, "layers": 2, "heads": 2}
FILE_BYTES, TOUCH_SAMPLES = 1 << 20, 128  # a training fetch's size: the allocator reuses its blocks
RSS_KEYS = ("rss_anon_before_data_mb", "rss_anon_after_full_pass_mb", "rss_anon_after_steps_mb")
PREPARE_CHILD = """\
import json, sys, time
import numpy, pandas  # imported before the timed part, as prepare's own imports would be
from scalelab.config import DataConfig, build
from scalelab.data.prepare import prepare
from scalelab.runtime.memory import status_kib
cfg = build(DataConfig, json.loads(sys.argv[1]))
base, start = status_kib("VmRSS"), time.perf_counter()
prepare(cfg, sys.argv[2], **({"seq_len": int(sys.argv[3])} if len(sys.argv) > 3 else {}))
took, peak = time.perf_counter() - start, status_kib("VmHWM")
above = max(peak - base, 1) / 1024
print(json.dumps({"prepare_s": took, "prepare_peak_mb": peak / 1024, "prepare_peak_above_start_mb": above}))
"""


def write_corpus(folder: Path, size_mb: int) -> Path:
    """`size_mb` files of 1 MB each, cut from the standard library's top-level .py files."""
    import sysconfig

    base = b"".join(p.read_bytes() for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")))
    base = base.decode("utf-8", "ignore").encode("ascii", "ignore")  # whole characters in every cut
    folder.mkdir(parents=True)
    for i in range(size_mb):
        offset = (i * 7919 * 1031) % len(base)
        (folder / f"part{i:05d}.py").write_bytes((base[offset:] + base * (FILE_BYTES // len(base) + 1))[:FILE_BYTES])
    return folder


def prepare_child(cfg: dict[str, Any], out: Path, *seq_len: int) -> dict[str, float]:
    """`prepare` of `cfg` (a data section) in a fresh process: its time and peak memory."""
    cmd = [sys.executable, "-c", PREPARE_CHILD, json.dumps(cfg), str(out), *map(str, seq_len)]
    return json.loads(pipeline.run(cmd, f"prepare of {cfg}").stdout.strip().splitlines()[-1])


def measure_rank(spec: dict[str, Any]) -> dict[str, Any]:
    """One rank of the DDP job: RssAnon before and after its full pass over its share and the loader arms."""
    env, manifest = dist.read_env(), verify(spec["data"])
    strategy = "ddp" if env.world_size > 1 else "single"
    spec = {**spec, "workload": "gpt", "input_shape": [], "num_classes": manifest["num_classes"], "strategy": strategy}
    rank = harness.rank_loop(spec | {"optim": {"name": "adamw", "lr": 3e-3}, "batch": 1})
    rss = [memory.status_kib("RssAnon") / 1024]
    split = open_split(spec["data"], "train", manifest, seq_len=rank.wl.seq_len)
    world, touch = env.world_size, max(min(TOUCH_SAMPLES, len(split) // env.world_size), 1)
    order = {"world_size": world, "rank": env.rank, "batch_size": touch, "num_batches": len(split) // (touch * world)}
    mine = {"samples_fetched": sum(len(split.fetch(i)[0]) for i in RankBatches(len(split), **order, seed=0))}
    rss.append(memory.status_kib("RssAnon") / 1024)
    train = {"strategy": strategy, "nproc_per_node": world, "batch_size": spec["batch_size"], "epochs": 1}
    plan = RunPlan.of(build(TrainConfig, train), len(split))
    loaders = {str(w): RunLoader(split, plan, env, seed=0, num_workers=int(w)) for w in spec["workers"]}
    mine["times"], reps = loader.time_arms(rank.loop, loaders, spec["steps"], 1, spec["busy"], 1, warmup=2)
    mine |= dict(zip(RSS_KEYS, [*rss, memory.status_kib("RssAnon") / 1024]))
    result = {"ranks": dist.all_gather_object(mine), "samples": len(split), **reps.json(), "is_main": env.is_main}
    del rank, loaders  # the model (and its DDP reducer) goes before the process group
    dist.shutdown()
    return result


def measure_size(ctx: harness.Context, size_mb: int) -> dict[str, Any]:
    """One size: its corpus prepared and checked here, then the DDP job on it."""
    args, data = ctx.args, ctx.work / f"prepared-{size_mb}"
    corpus = write_corpus(ctx.work / f"corpus-{size_mb}", size_mb)
    text = {"source": "text", "text": {"path": str(corpus)}}
    row = {"size_mb": size_mb, **prepare_child(text, data, args.model["seq_len"])}
    shutil.rmtree(corpus)
    row["prepared_bytes"] = sum(p.stat().st_size for p in data.iterdir())
    row["verify_s"], row["verify_full_s"] = timed(verify, data), timed(verify, data, full=True)
    spec = {"data": str(data), "model": args.model, "batch_size": args.batch_size, "steps": args.steps}
    spec |= {"workers": args.workers, "busy": ctx.policy()}
    ranks = ctx.ranks("data", spec, f"size-{size_mb}", nproc=args.nproc)
    shutil.rmtree(data)
    row |= {"train_samples": ranks["samples"], "dropped": ranks["dropped"], "disturbance": ranks["disturbance"]}
    row |= {key: [r[key] for r in ranks["ranks"]] for key in ("samples_fetched", *RSS_KEYS)}
    per_rank = {arm: [r["times"][arm] for r in ranks["ranks"]] for arm in map(str, args.workers)}
    return row | {"loader": {arm: loader.arm_figures(times, args.steps) for arm, times in per_rank.items()}}


def sparse_10gb_check_s(work: Path) -> float:
    """The start-up check of one 10 GB token file, made sparse (it takes no disk)."""
    path, rows = work / "sparse.tokens.npy", 10 * 10**9
    np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(rows,))  # the header, then a hole
    entry = {"file": path.name, "dtype": "|u1", "shape": [rows], "bytes": path.stat().st_size}
    took = timed(arrays.check_file, work, entry | {"sha256": "", "probe_sha256": arrays.probe_digest(path)})
    path.unlink()
    return took


def csv_rows(rows: list[int], work: Path) -> dict[str, list[float]]:
    """`prepare` of CSV tables of `rows` rows, each in a fresh process."""
    import pandas as pd

    got = []
    for n in rows:
        rng, csv = np.random.default_rng(0), work / f"rows-{n}.csv"
        frame = pd.DataFrame(rng.standard_normal((n, 32)), columns=[f"f{i}" for i in range(32)])
        frame.assign(label=rng.integers(0, 10, n)).to_csv(csv, index=False)
        got.append(prepare_child({"source": "file", "file": {"path": str(csv), "label_column": "label"}}, work / "p"))
        csv.unlink()
        shutil.rmtree(work / "p")
    return {"rows": rows, **{key: [g[key] for g in got] for key in got[0]}}


SLOPES = {  # JSON slope -> (figure, goal, what its line says, the rows' key; the steepest rank's counts)
    "rss_anon_per_rank": ("data_rss_anon_slope", RSS, "per-rank RssAnon", "rss_anon_after_full_pass_mb"),
    "prepare_time": ("data_prepare_slope", PREPARE, "prepare time", "prepare_s"),
    "prepare_peak_memory": ("data_prepare_peak_slope", PEAK, "prepare peak memory", "prepare_peak_above_start_mb"),
}


def measure(ctx: harness.Context) -> dict[str, Any]:
    args = ctx.args
    rows = [measure_size(ctx, size) for size in sorted(args.sizes_mb)]
    sparse_s = sparse_10gb_check_s(ctx.work)
    sizes, dropped, slopes = [r["size_mb"] for r in rows], [d for r in rows for d in r["dropped"]], {}
    span = f"{sizes[0]}-{sizes[-1]} MB"
    for key, (name, goal, what, column) in SLOPES.items():
        per_row = [r[column] if isinstance(r[column], list) else [r[column]] for r in rows]  # RssAnon: one a rank
        value = slopes[key] = max(fit(sizes, list(s))["slope"] for s in zip(*per_row)) if len(rows) > 1 else None
        text = f"{what} log-log slope {value:.3f} over {span}" if value is not None else f"{what}: one size only"
        ctx.figure(name, text, value, goal)
    text = f"start-up check of a 10 GB split {sparse_s * 1000:.1f} ms (sparse file)"
    ctx.figure("data_verify_10gb", text, sparse_s, VERIFY)
    wait = {arm: max(r["loader"][arm]["wait_fraction"] for r in rows) for arm in map(str, args.workers)}
    for arm, frac in wait.items():
        text = f"step time waiting for data {100 * frac:.2f}% at num_workers {arm} (worst of {span}, GPT on text)"
        ctx.figure(f"data_loader_wait_workers{arm}", text, frac, loader.GOAL, dropped=dropped)
    return {
        "rows": rows, "slopes": slopes, "verify_10gb_sparse_s": sparse_s, "loader_wait_fraction_worst_size": wait,
        "csv_rows": csv_rows(args.csv_rows, ctx.work) if args.csv_rows[0] else None,
        "settings": {k: getattr(args, k) for k in ("repeats", "steps", "workers", "batch_size", "model", "nproc")},
    }  # fmt: skip


OPTIONS = (
    opt("--sizes-mb", [10, 100, 1000], "MB of text per size"),
    opt("--repeats", 3, "timed repeats per size and arm"),
    opt("--steps", 30, "training steps per arm and repeat"),
    opt("--workers", [0, 2], "num_workers of each arm"),
    opt("--batch-size", 16, "sequences per rank and step"),
    opt("--model", GPT, "train.model of the gpt workload (JSON)", type=json.loads),
    opt("--nproc", 2, "ranks of the DDP job"),
    opt("--csv-rows", [1000, 10_000, 100_000], "CSV rows prepared (0: skip); 10^6: the issue's full range"),
)
BENCH = harness.Benchmark("data", "data.json", METHOD, measure, OPTIONS)
