"""Moving outputs and checkpoints through the store: `dvc push`/`dvc pull` and a sharded checkpoint
against a plain S3 client moving the same bytes to the same server."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

from scalelab.bench import harness, pipeline, stats
from scalelab.bench.harness import Goal, opt, timed
from scalelab.runtime.io import file_digests
from scalelab.storage import server, write_remote

METHOD = """\
A real S3 server on this machine (`rclone serve s3` over a temporary folder, as `make store` starts
it) and a temporary git + DVC repository whose default remote it is. Per size in `--sizes-mb`, one
file of random bytes is `dvc add`ed (untimed). Arms interleaved: in every round, for every size,
`dvc push` (DVC's Python API, into a prefix of its own so that every push uploads) is paired with
boto3's `upload_file`, and `dvc pull` (the file and its cache object removed first) with boto3's
`download_file`; the first arm alternates by round; busy rounds are retried or dropped. The
checkpoint pair: a `--checkpoint-mb` state dict of float32 tensors saved with DCP's fsspec writer
to the store (one process) and loaded with its reader, against boto3 moving the files DCP writes
(saved once locally). Figure: median over rounds of arm / plain, bootstrap 95% interval over
rounds; every pulled or loaded byte is checked.
"""
OUT_FILE = "store.json"
GOAL = Goal("<=", 1.2)
PORT_RETRIES = 5


def md5_of(path: Path) -> str:
    return file_digests(path, "md5")[0]


def random_file(path: Path, size_mb: int) -> None:
    with open(path, "wb") as f:
        for _ in range(size_mb):
            f.write(os.urandom(1 << 20))


class Bench:
    """The server, the DVC repository and a boto3 client, in one temporary folder."""

    def __init__(self, work: Path) -> None:
        import boto3

        self.work = work
        self.server = start_server(work / "server")
        self.store = self.server.store()
        keys = {"aws_access_key_id": self.server.access_key_id, "aws_secret_access_key": self.server.secret_access_key}
        self.s3 = boto3.client("s3", endpoint_url=self.server.endpoint, region_name="us-east-1", **keys)
        self.repo = work / "repo"
        self.repo.mkdir()
        pipeline.git(self.repo, "init", "-q")
        self.dvc = str(Path(sys.executable).parent / "dvc")
        subprocess.run([self.dvc, "init", "-q"], cwd=self.repo, check=True)
        subprocess.run([self.dvc, "config", "core.analytics", "false"], cwd=self.repo, check=True)

    def close(self) -> None:
        server.stop(self.server.base)

    def add(self, name: str, size_mb: int) -> Path:
        path = self.repo / name
        random_file(path, size_mb)
        subprocess.run([self.dvc, "add", "-q", name], cwd=self.repo, check=True)
        return path

    def _remote(self, prefix: str) -> None:
        write_remote(self.repo, dataclasses.replace(self.store, url=self.store.join(prefix)), local=True)

    def dvc_push(self, path: Path, prefix: str) -> float:
        from dvc.repo import Repo

        self._remote(prefix)
        with Repo(str(self.repo)) as repo:
            return timed(repo.push, targets=[f"{path}.dvc"])

    def dvc_pull(self, path: Path, prefix: str, md5: str) -> float:
        from dvc.repo import Repo

        self._remote(prefix)
        (self.repo / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]).unlink()  # pulled from the store
        path.unlink()
        with Repo(str(self.repo)) as repo:
            took = timed(repo.pull, targets=[f"{path}.dvc"])
        if md5_of(path) != md5:
            raise RuntimeError(f"dvc pull of {path.name} from {prefix} gave other bytes")
        return took

    def plain_push(self, path: Path, key: str) -> float:
        return timed(self.s3.upload_file, str(path), self.server.bucket, key)

    def plain_pull(self, key: str, dest: Path, md5: str) -> float:
        took = timed(self.s3.download_file, self.server.bucket, key, str(dest))
        if md5_of(dest) != md5:
            raise RuntimeError(f"boto3 download of {key} gave other bytes")
        dest.unlink()
        return took


def start_server(base: Path) -> server.Server:
    import socket

    for _ in range(PORT_RETRIES):  # a free port can be taken between the probe and the bind
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        try:
            return server.start(base, port)
        except Exception:
            server.stop(base)
    return server.start(base, port)


def checkpoint_state(size_mb: int) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    per = size_mb * (1 << 20) // 4 // 8
    return {"model": {f"layer{i}.weight": torch.randn(per, generator=generator) for i in range(8)}}


def measure_pairs(args: Any, work: Path, policy: dict[str, Any]) -> tuple[dict[str, dict[str, list[float]]], Any]:
    bench = Bench(work)
    try:
        files = {size: bench.add(f"blob-{size}mb.bin", size) for size in args.sizes_mb}
        md5 = {size: md5_of(path) for size, path in files.items()}
        ckpt = Checkpoint(bench, checkpoint_state(args.checkpoint_mb), work)

        def take(r: int) -> dict[str, tuple[float, float]]:  # one round: every pair, the first arm alternating
            pairs = {}
            for size, path in files.items():
                prefix, key = f"dvc/{r}-{size}", f"plain/{r}-{size}/{path.name}"
                pairs[f"push_{size}mb"] = (partial(bench.dvc_push, path, prefix), partial(bench.plain_push, path, key))
                pairs[f"pull_{size}mb"] = (
                    partial(bench.dvc_pull, path, prefix, md5[size]),
                    partial(bench.plain_pull, key, work / "download.bin", md5[size]),
                )
            pairs["checkpoint_save"] = (partial(ckpt.save, r), partial(ckpt.plain_save, r))
            pairs["checkpoint_load"] = (partial(ckpt.load, r), partial(ckpt.plain_load, r))
            if r % 2 == 0:
                return {name: (arm(), plain()) for name, (arm, plain) in pairs.items()}
            return {name: tuple(reversed((plain(), arm()))) for name, (arm, plain) in pairs.items()}

        reps = harness.take_repeats(take, policy)
    finally:
        bench.close()
    names = reps.kept[0].keys()
    return {n: {"arm_s": [r[n][0] for r in reps.kept], "plain_s": [r[n][1] for r in reps.kept]} for n in names}, reps


class Checkpoint:
    """A sharded checkpoint of `state` through DCP's fsspec writer and reader, and its files by boto3."""

    def __init__(self, bench: Bench, state: dict[str, Any], work: Path) -> None:
        import torch.distributed.checkpoint as dcp

        self.bench, self.state, self.work = bench, state, work
        self.local = work / "dcp-local"
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(self.local)))
        self.parts = sorted(p for p in self.local.iterdir() if p.is_file())

    def url(self, r: int) -> str:
        return self.bench.store.join(f"ckpt/{r}")

    def save(self, r: int) -> float:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        writer = FsspecWriter(self.url(r), **self.bench.store.options())
        return timed(dcp.save, self.state, storage_writer=writer)

    def load(self, r: int) -> float:
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        target = {"model": {k: torch.empty_like(v) for k, v in self.state["model"].items()}}
        reader = FsspecReader(self.url(r), **self.bench.store.options())
        took = timed(dcp.load, target, storage_reader=reader)
        if not all(torch.equal(target["model"][k], v) for k, v in self.state["model"].items()):
            raise RuntimeError(f"the checkpoint loaded from {self.url(r)} differs from the one saved")
        return took

    def plain_save(self, r: int) -> float:
        bucket, s3 = self.bench.server.bucket, self.bench.s3
        return timed(lambda: [s3.upload_file(str(p), bucket, f"plain-ckpt/{r}/{p.name}") for p in self.parts])

    def plain_load(self, r: int) -> float:
        bucket, s3, dest = self.bench.server.bucket, self.bench.s3, self.work / "plain-load"
        dest.mkdir(exist_ok=True)
        took = timed(
            lambda: [s3.download_file(bucket, f"plain-ckpt/{r}/{p.name}", str(dest / p.name)) for p in self.parts]
        )
        for p in self.parts:
            if md5_of(dest / p.name) != md5_of(p):
                raise RuntimeError(f"boto3 download of plain-ckpt/{r}/{p.name} gave other bytes")
        shutil.rmtree(dest)
        return took


def measure(ctx: harness.Context) -> dict[str, Any]:
    args = ctx.args
    rows, reps = measure_pairs(args, ctx.work, ctx.policy())
    figures = {}
    for name, row in rows.items():
        fig = figures[name] = {**row, **stats.ratio_figures(row["arm_s"], row["plain_s"])}
        fig["meets_goal"] = GOAL.met(fig["median_ratio"])
        text = f"{name.replace('_', ' ')}: scalelab/plain S3 client {stats.ratio_text(fig, 2)}"
        ctx.figure(f"store_{name}", text, fig["median_ratio"], GOAL, dropped=reps.dropped)
    return {
        "sizes_mb": args.sizes_mb, "checkpoint_mb": args.checkpoint_mb, "repeats": args.repeats,
        "goal_ratio": GOAL.target, "figures": figures, "meets_goal": all(f["meets_goal"] for f in figures.values()),
        **reps.json(),
    }  # fmt: skip


OPTIONS = (
    opt("--sizes-mb", [10, 100, 1000], "output sizes"),
    opt("--checkpoint-mb", 100, "the sharded checkpoint's size"),
    opt("--repeats", 3, "interleaved rounds"),
)
BENCH = harness.Benchmark("store", "store.json", METHOD, measure, OPTIONS, scratch_outside=True)
