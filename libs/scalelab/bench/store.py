"""Moving outputs and checkpoints through the store: `dvc push`/`dvc pull` and a sharded checkpoint
against a plain S3 client moving the same bytes to the same server."""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch

from scalelab.bench import harness, pipeline, stats
from scalelab.bench.harness import Goal, opt, timed
from scalelab.runtime.io import file_digests
from scalelab.storage import server, write_remote

METHOD = """\
A real S3 server on this machine (`rclone serve s3` over a temporary folder, as `make store` starts it), the default
remote of a temporary git + DVC repository; per size, a file of random bytes added to DVC (untimed). Arms interleaved:
every round, for every size, `dvc push` (DVC's Python API, into a prefix of its own so that every push uploads) is
paired with boto3's `upload_file`, `dvc pull` (the file and its cache object removed first) with its `download_file`; a
state dict of float32 tensors saved with DCP's fsspec writer to the store (one process) and loaded with its reader, with
boto3 moving the files DCP writes (saved once locally). The first arm alternates by round; busy rounds are retried, then
dropped. Figure: median of arm / plain over rounds, bootstrap 95% interval; every pulled or loaded byte is checked.
"""
OUT_FILE = "store.json"
GOAL = Goal("<=", 1.2)
PORT_RETRIES = 5


def md5_of(path: Path) -> str:
    return file_digests(path, "md5")[0]


def start_server(base: Path) -> server.Server:
    """The S3 server on a free port (another process can take it between the probe and the bind)."""
    for _ in range(PORT_RETRIES):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        try:
            return server.start(base, port)
        except Exception:
            server.stop(base)
    return server.start(base, port)


class Bench:
    """The server, a git + DVC repository, a boto3 client and the checkpoint, in one temporary folder."""

    def __init__(self, work: Path) -> None:
        import boto3

        self.work, self.repo, self.dvc_bin = work, work / "repo", str(Path(sys.executable).parent / "dvc")
        self.server = start_server(work / "server")
        self.store = self.server.store()
        keys = {"aws_access_key_id": self.server.access_key_id, "aws_secret_access_key": self.server.secret_access_key}
        self.s3 = boto3.client("s3", endpoint_url=self.server.endpoint, region_name="us-east-1", **keys)
        self.repo.mkdir()
        pipeline.git(self.repo, "init", "-q")
        for args in (["init", "-q"], ["config", "core.analytics", "false"]):
            subprocess.run([self.dvc_bin, *args], cwd=self.repo, check=True)

    def add(self, size_mb: int) -> tuple[Path, str]:
        """A file of `size_mb` random MB, `dvc add`ed: its path and md5."""
        path = self.repo / f"blob-{size_mb}mb.bin"
        with path.open("wb") as f:
            for _ in range(size_mb):
                f.write(os.urandom(1 << 20))
        subprocess.run([self.dvc_bin, "add", "-q", path.name], cwd=self.repo, check=True)
        return path, md5_of(path)

    def dvc(self, op: str, path: Path, prefix: str, md5: str) -> float:
        """`dvc push` or `dvc pull` (`op`) of `path` through DVC's Python API, its remote at `prefix`."""
        from dvc.repo import Repo

        write_remote(self.repo, dataclasses.replace(self.store, url=self.store.join(prefix)), local=True)
        if op == "pull":  # from the store: neither the file nor its cache object is here
            (self.repo / ".dvc/cache/files/md5" / md5[:2] / md5[2:]).unlink()
            path.unlink()
        with Repo(str(self.repo)) as repo:
            took = timed(getattr(repo, op), targets=[f"{path}.dvc"])
        if op == "pull" and md5_of(path) != md5:
            raise RuntimeError(f"dvc pull of {path.name} from {prefix} gave other bytes")
        return took

    def plain(self, op: str, files: dict[Path, str], prefix: str) -> float:
        """boto3 moving `files` (path -> md5) under `prefix`: "push" uploads them, "pull" downloads them (checked)."""
        took, dest = 0.0, self.work / "download.bin"
        for path, md5 in files.items():
            key = f"{prefix}/{path.name}"
            if op == "push":
                took += timed(self.s3.upload_file, str(path), self.server.bucket, key)
                continue
            took += timed(self.s3.download_file, self.server.bucket, key, str(dest))
            if md5_of(dest) != md5:
                raise RuntimeError(f"boto3 download of {key} gave other bytes")
            dest.unlink()
        return took

    def checkpoint(self, size_mb: int) -> None:
        """A state dict of 8 float32 tensors, `size_mb` MB in all, and the files DCP writes of it locally."""
        import torch.distributed.checkpoint as dcp

        generator, per = torch.Generator().manual_seed(0), size_mb * (1 << 20) // 4 // 8
        self.state = {"model": {f"layer{i}.weight": torch.randn(per, generator=generator) for i in range(8)}}
        dcp.save(self.state, storage_writer=dcp.FileSystemWriter(str(self.work / "dcp-local")))
        self.parts = {p: md5_of(p) for p in sorted((self.work / "dcp-local").iterdir()) if p.is_file()}

    def dcp(self, op: str, r: int) -> float:
        """DCP's fsspec writer ("push") or reader ("pull", checked) of the checkpoint at ckpt/`r` in the store."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import _fsspec_filesystem as fsspec

        url, options = self.store.join(f"ckpt/{r}"), self.store.options()
        if op == "push":
            return timed(dcp.save, self.state, storage_writer=fsspec.FsspecWriter(url, **options))
        target = {"model": {k: torch.empty_like(v) for k, v in self.state["model"].items()}}
        took = timed(dcp.load, target, storage_reader=fsspec.FsspecReader(url, **options))
        if not all(torch.equal(target["model"][k], v) for k, v in self.state["model"].items()):
            raise RuntimeError(f"the checkpoint loaded from {url} differs from the one saved")
        return took


def measure(ctx: harness.Context) -> dict[str, Any]:
    args, bench = ctx.args, Bench(ctx.work)
    try:
        files = {size: bench.add(size) for size in args.sizes_mb}
        bench.checkpoint(args.checkpoint_mb)

        def take(r: int) -> dict[str, dict[str, float]]:  # a round: each pair's seconds, its first arm alternating
            pairs = {}
            for (size, (path, md5)), op in itertools.product(files.items(), ("push", "pull")):
                pairs[f"{op}_{size}mb"] = {
                    "arm": partial(bench.dvc, op, path, f"dvc/{r}-{size}", md5),
                    "plain": partial(bench.plain, op, {path: md5}, f"plain/{r}-{size}"),
                }
            for op, verb in (("push", "save"), ("pull", "load")):
                pairs[f"checkpoint_{verb}"] = {
                    "arm": partial(bench.dcp, op, r),
                    "plain": partial(bench.plain, op, bench.parts, f"plain-ckpt/{r}"),
                }
            return {name: {arm: pair[arm]() for arm in harness.rotated(pair, r)} for name, pair in pairs.items()}

        reps = harness.take_repeats(take, ctx.policy())
    finally:
        server.stop(bench.server.base)
    figures = {}
    for name in reps.kept[0]:
        arm, plain = ([r[name][key] for r in reps.kept] for key in ("arm", "plain"))
        fig = figures[name] = {"arm_s": arm, "plain_s": plain, **stats.ratio_figures(arm, plain)}
        text = f"{name.replace('_', ' ')}: scalelab/plain S3 client {stats.ratio_text(fig, 2)}"
        ctx.figure(f"store_{name}", text, fig["median_ratio"], GOAL, dropped=reps.dropped)
    settings = {"sizes_mb": args.sizes_mb, "checkpoint_mb": args.checkpoint_mb, "repeats": args.repeats}
    return settings | {"figures": figures, **reps.json()}


OPTIONS = (
    opt("--sizes-mb", [10, 100, 1000], "output sizes"),
    opt("--checkpoint-mb", 100, "the sharded checkpoint's size"),
    opt("--repeats", 3, "interleaved rounds"),
)
BENCH = harness.Benchmark("store", OUT_FILE, METHOD, measure, OPTIONS, scratch_outside=True)
