"""Data at scale: prepare, start-up check, per-rank memory and loader wait against the data's size.

    scalelab bench data --out results/bench                 # -> results/bench/data.json
    scalelab bench data --sizes-mb 10 100 1000 --repeats 3

The method is METHOD below; the JSON file carries it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scalelab.bench import stats
from scalelab.bench.scaling import fit
from scalelab.runtime.io import atomic_write_json

METHOD = """\
For each size (`--sizes-mb`, MB of text = byte tokens): a corpus of 1 MB files cut from the
CPython standard library's own top-level .py files (repeated), prepared with data.source text in a
fresh process (`prepare` timed alone, after its imports; peak memory = the process's ru_maxrss
less its resident memory before prepare). Then, in the parent: `verify` (the start-up check:
sizes, headers, the sha256 of files under 32 MiB, a 1 MiB probe of larger ones) and
`verify(full=True)` (every byte hashed), each timed once with the files in the page cache. Then
a DDP job on 2 gloo processes (torchrun, 1 thread each; scalelab.bench.data_rank): each rank maps
the split, fetches every sample of its share once, then trains the GPT workload (`--model`) with
training's own RunLoader (persistent workers) for `--steps` steps per arm and repeat, arms
num_workers 0 and 2 interleaved. Per-rank RssAnon (/proc/self/status) after the full pass and
after the steps; loader wait = wait / (wait + compute) summed over a repeat's steps, median over
repeats, on the rank that waited most. Slopes are least-squares fits of log(figure) on log(size)
over the sizes. A 10 GB sparse token file (no disk used) is checked the way start-up checks it,
to time the check at that size without writing 10 GB.
"""
OUT_FILE = "data.json"
RSS_SLOPE_GOAL, PREPARE_SLOPE_GOAL, PEAK_SLOPE_GOAL = 0.1, 1.1, 0.1
WAIT_GOAL, VERIFY_GOAL_S = 0.05, 2.0
FILE_BYTES = 1 << 20
PREPARE_CHILD = """\
import json, resource, sys, time
from pathlib import Path
import numpy, pandas  # imported before the timed part, as prepare's own imports would be
from scalelab.config import DataConfig, build
from scalelab.data.prepare import prepare
status = lambda: {l.split(':')[0]: int(l.split()[1]) for l in Path('/proc/self/status').read_text().splitlines()
                  if l.startswith(('VmRSS', 'VmHWM'))}
cfg = build(DataConfig, {"source": "text", "text": {"path": sys.argv[1]}})
base = status()['VmRSS']
start = time.perf_counter()
prepare(cfg, sys.argv[2], seq_len=int(sys.argv[3]))
took = time.perf_counter() - start
print(json.dumps({"prepare_s": took, "base_kb": base, "peak_kb": status()['VmHWM']}))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[10, 100, 1000], help="MB of text per size")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per size and arm (default: 3)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per arm and repeat")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="num_workers of each arm")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per rank and step")
    parser.add_argument(
        "--model",
        type=json.loads,
        default={"vocab_size": 256, "seq_len": 64, "d_model": 64, "layers": 2, "heads": 2},
        help="train.model of the gpt workload (JSON)",
    )
    parser.add_argument("--nproc", type=int, default=2, help="ranks of the DDP job")


def write_corpus(folder: Path, size_mb: int) -> Path:
    """`size_mb` files of 1 MB each, cut from the standard library's top-level .py files."""
    import sysconfig

    base = b"".join(p.read_bytes() for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")))
    base = base.decode("utf-8", "ignore").encode("ascii", "ignore")  # whole characters in every cut
    folder.mkdir(parents=True)
    for i in range(size_mb):
        offset = (i * 7919 * 1031) % len(base)
        piece = (base[offset:] + base)[:FILE_BYTES]
        while len(piece) < FILE_BYTES:
            piece += base[: FILE_BYTES - len(piece)]
        (folder / f"part{i:05d}.py").write_bytes(piece)
    return folder


def prepare_child(corpus: Path, out: Path, seq_len: int) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, "-c", PREPARE_CHILD, str(corpus), str(out), str(seq_len)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"prepare of {corpus} failed: {proc.stderr.strip()[-1500:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "prepare_s": got["prepare_s"],
        "prepare_peak_mb": got["peak_kb"] / 1024,
        "prepare_peak_above_start_mb": max(got["peak_kb"] - got["base_kb"], 1) / 1024,
    }


def timed(fn: Any, *args: Any, **kwargs: Any) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def run_ranks(args: argparse.Namespace, data: Path, work: Path) -> dict[str, Any]:
    spec = {
        "data": str(data),
        "model": args.model,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "repeats": args.repeats,
        "workers": args.workers,
    }
    spec_path, out_path = work / "rank.spec.json", work / "rank.out.json"
    atomic_write_json(spec_path, spec)
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}"]
    cmd = [sys.executable, *launcher, "-m", "scalelab.bench.data_rank", str(spec_path), str(out_path)]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    if proc.returncode != 0 or not out_path.is_file():
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"data benchmark ranks exited {proc.returncode}: {tail[-800:]}")
    return json.loads(out_path.read_text())


def measure_size(args: argparse.Namespace, size_mb: int, work: Path) -> dict[str, Any]:
    from scalelab.data.store import verify

    corpus = write_corpus(work / f"corpus-{size_mb}", size_mb)
    data = work / f"prepared-{size_mb}"
    row: dict[str, Any] = {"size_mb": size_mb, **prepare_child(corpus, data, args.model["seq_len"])}
    shutil.rmtree(corpus)
    row["prepared_bytes"] = sum(p.stat().st_size for p in data.iterdir())
    row["verify_s"] = timed(verify, data)
    row["verify_full_s"] = timed(verify, data, full=True)
    ranks = run_ranks(args, data, work)
    shutil.rmtree(data)
    row["train_samples"] = ranks["samples"]
    row["rank_verify_s"] = [r["verify_s"] for r in ranks["ranks"]]
    row["samples_fetched"] = [r["samples_fetched"] for r in ranks["ranks"]]
    for key in ("rss_anon_before_data_mb", "rss_anon_after_full_pass_mb", "rss_anon_after_steps_mb"):
        row[key] = [r[key] for r in ranks["ranks"]]
    row["loader"] = {}
    for arm in map(str, args.workers):
        per_rank = [r["times"][arm] for r in ranks["ranks"]]  # rank -> repeat -> [wait_s, compute_s]
        fractions = [max(r[i][0] / (r[i][0] + r[i][1]) for r in per_rank) for i in range(args.repeats)]
        steps = args.steps
        row["loader"][arm] = {
            "wait_fraction": statistics.median(fractions),
            "repeat_wait_fractions": fractions,
            "wait_ms_per_step": [[1000 * rep[0] / steps for rep in r] for r in per_rank],
            "compute_ms_per_step": [[1000 * rep[1] / steps for rep in r] for r in per_rank],
        }
    return row


def sparse_10gb_check_s(work: Path) -> float:
    """The start-up check of one 10 GB token file, made sparse (it takes no disk)."""
    import numpy as np

    from scalelab.data import arrays

    path = work / "sparse.tokens.npy"
    writer = arrays.NpyWriter(path, np.uint8)
    writer.rows = 10 * 10**9
    writer.close()
    with path.open("r+b") as fh:
        fh.truncate(writer._data_offset + writer.rows)
    entry = {"file": path.name, "dtype": "|u1", "shape": [writer.rows], "bytes": path.stat().st_size}
    entry.update(sha256="", probe_sha256=arrays.probe_digest(path))
    took = timed(arrays.check_file, work, entry)
    path.unlink()
    return took


def summarize(rows: list[dict[str, Any]], sparse_s: float, args: argparse.Namespace) -> dict[str, Any]:
    sizes = [r["size_mb"] for r in rows]
    rank_rss = [[r["rss_anon_after_full_pass_mb"][k] for r in rows] for k in range(args.nproc)]
    slopes = {
        "rss_anon_per_rank": max(fit(sizes, series)["slope"] for series in rank_rss) if len(rows) > 1 else None,
        "prepare_time": fit(sizes, [r["prepare_s"] for r in rows])["slope"] if len(rows) > 1 else None,
        "prepare_peak_memory": fit(sizes, [r["prepare_peak_above_start_mb"] for r in rows])["slope"]
        if len(rows) > 1
        else None,
    }
    wait = {arm: max(r["loader"][arm]["wait_fraction"] for r in rows) for arm in map(str, args.workers)}
    return {
        "benchmark": "data",
        "method": METHOD.strip(),
        "sizes_mb": sizes,
        "rows": rows,
        "slopes": slopes,
        "verify_10gb_sparse_s": sparse_s,
        "loader_wait_fraction_worst_size": wait,
        "goals": {
            "rss_anon_slope_lt": RSS_SLOPE_GOAL,
            "prepare_time_slope_le": PREPARE_SLOPE_GOAL,
            "prepare_peak_slope_lt": PEAK_SLOPE_GOAL,
            "loader_wait_fraction_le": WAIT_GOAL,
            "verify_10gb_s_lt": VERIFY_GOAL_S,
        },
        "settings": {k: getattr(args, k) for k in ("repeats", "steps", "workers", "batch_size", "model", "nproc")},
        **stats.machine(),
    }


def _verdict(value: float | None, ok: bool) -> bool | None:
    return None if value is None else ok


def write_summary(out_dir: Path, result: dict[str, Any]) -> None:
    s, span = result["slopes"], f"{result['sizes_mb'][0]}-{result['sizes_mb'][-1]} MB"
    lines = [
        (
            "data_rss_anon_slope",
            s["rss_anon_per_rank"],
            lambda v: v < RSS_SLOPE_GOAL,
            f"< {RSS_SLOPE_GOAL}",
            "per-rank RssAnon log-log slope",
        ),
        (
            "data_prepare_slope",
            s["prepare_time"],
            lambda v: v <= PREPARE_SLOPE_GOAL,
            f"<= {PREPARE_SLOPE_GOAL}",
            "prepare time log-log slope",
        ),
        (
            "data_prepare_peak_slope",
            s["prepare_peak_memory"],
            lambda v: v < PEAK_SLOPE_GOAL,
            f"< {PEAK_SLOPE_GOAL} (bounded)",
            "prepare peak memory log-log slope",
        ),
    ]
    for name, value, ok, goal, what in lines:
        figure = f"{what} {value:.3f} over {span}" if value is not None else f"{what}: one size only"
        stats.write_summary_line(out_dir, name, figure, goal, _verdict(value, value is not None and ok(value)))
    sparse = result["verify_10gb_sparse_s"]
    stats.write_summary_line(
        out_dir,
        "data_verify_10gb",
        f"start-up check of a 10 GB split {sparse * 1000:.1f} ms (sparse file)",
        f"< {VERIFY_GOAL_S:.0f} s",
        sparse < VERIFY_GOAL_S,
    )
    for arm, frac in result["loader_wait_fraction_worst_size"].items():
        stats.write_summary_line(
            out_dir,
            f"data_loader_wait_workers{arm}",
            f"step time waiting for data {100 * frac:.2f}% at num_workers {arm} (worst of {span}, GPT on text)",
            f"<= {100 * WAIT_GOAL:.0f}%",
            frac <= WAIT_GOAL,
        )


def run(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Measures every size, writes data.json and its summary lines; returns the result."""
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".bench-data-", dir=out_dir))
    try:
        rows = [measure_size(args, size, work) for size in sorted(args.sizes_mb)]
        sparse_s = sparse_10gb_check_s(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = summarize(rows, sparse_s, args)
    atomic_write_json(out_dir / OUT_FILE, result)
    write_summary(out_dir, result)
    return result


def headline(result: dict, out: Path) -> str:
    s = result["slopes"]
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    waits = ", ".join(f"{100 * v:.2f}% at {k} workers" for k, v in result["loader_wait_fraction_worst_size"].items())
    return (
        f"data: RssAnon slope {fmt(s['rss_anon_per_rank'])}, prepare slope {fmt(s['prepare_time'])}, "
        f"peak slope {fmt(s['prepare_peak_memory'])}, 10 GB check {1000 * result['verify_10gb_sparse_s']:.1f} ms, "
        f"loader wait {waits} -> {out / OUT_FILE}"
    )
