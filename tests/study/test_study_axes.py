"""The study's axes on a small grid: bf16, torch.compile and two batch sizes, with the fp16 cells
skipped on a CPU; the rows, speedup_batch.csv and the report's answer lines."""

import json

import pandas as pd
import pytest
from test_speedup import TINY

from helpers import run_cli, tiny_params, write_params

pytestmark = pytest.mark.integration

AXES = {
    **TINY,
    "device": "cpu",
    "strategies": ["single", "ddp"],
    "world_sizes": [2],
    "batch_sizes": [64, 256],
    "precisions": ["fp32", "bf16", "fp16"],
    "compile": [False, True],
}


def test_a_grid_of_precisions_compile_and_batch_sizes(workdir):
    write_params(workdir / "params.yaml", tiny_params(speedup=AXES, tracking={"enabled": False}))
    run_cli("speedup", "--out", "results/speedup", cwd=workdir)
    out = workdir / "results/speedup"
    frame = pd.read_csv(out / "speedup.csv", keep_default_na=False).set_index("name")

    setups = ["single-t1", "single-t2", "ddp-w2"]
    suffixes = [p + c + b for b in ("", "-b256") for p in ("", "-bf16", "-fp16") for c in ("", "-compiled")]
    assert list(frame.index) == [s + x for s in setups for x in suffixes]
    fp16 = frame[frame.precision == "fp16"]
    assert len(fp16) == 12 and (fp16.status == "skipped").all()
    assert fp16.reason.str.contains("fp16 needs CUDA").all() and (fp16.samples_per_s_median == "").all()
    ran = frame[frame.precision != "fp16"]
    assert (ran.status == "ok").all(), ran.reason.to_dict()
    assert sorted(set(ran.batch_size.astype(int))) == [64, 256]
    compiled = ran[ran.compile.astype(str) == "True"]
    assert len(compiled) == 12 and (compiled.compile_s.astype(float) > 0).all()
    # each cell ran what its row says: the measured global batch is its batch (x2 ranks for ddp)
    for name, row in ran.iterrows():
        [path] = (out / "cells").glob(f"{name}-{'?' * 16}.json")  # the cache: <cell>-<key>.json
        cell = json.loads(path.read_text())
        assert cell["global_batch"] == int(row.batch_size) * int(row.world_size), name
        assert cell["peak_mem_bytes_per_rank"] > 0 and cell["param_bytes_per_rank"] > 0, name

    batch = pd.read_csv(out / "speedup_batch.csv")
    assert sorted(set(batch[batch.name.str.startswith("ddp-w2")].batch_size)) == [64, 256]
    crossover = pd.read_csv(out / "speedup_crossover.csv", keep_default_na=False)
    assert list(crossover.world_size) == [2] and crossover.measured.iloc[0] != ""
    md = (out / "speedup.md").read_text()
    answers = md.split("## Answers")[1].split("\n## ")[0]
    assert "bf16" in answers and "compile" in answers and "crossover" in answers.lower()
    assert "memory" in answers.lower()
    fastest = frame[frame.status == "ok"].samples_per_s_median.astype(float).idxmax()
    assert fastest in answers.splitlines()[2] or fastest in answers  # the fastest cell is named
