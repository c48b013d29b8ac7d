"""The study's report on hand-made results: no processes, numbers chosen so each answer is known.

The grid: single-t1, single-t2, ddp-w1 (2 threads), ddp-w2, fsdp-w2 (1 thread each) at batches 64
and 256 in fp32 eager; each at batch 64 in bf16; single-t1 and ddp-w2 compiled; ddp-w2 in fp16,
skipped as on a CPU.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest

from helpers import tiny_params
from scalelab.config import parse_params
from scalelab.study import batch as batch_view
from scalelab.study import comm_model, measured, plots, report
from scalelab.study.plan import Cell

FP16_REASON = "fp16 needs CUDA: its GradScaler and fp16 kernels are for GPUs; on CPU use bf16"
SETUPS = {  # name: (strategy, world_size, threads_per_process)
    "single-t1": ("single", 1, 1),
    "single-t2": ("single", 1, 2),
    "ddp-w1": ("ddp", 1, 2),
    "ddp-w2": ("ddp", 2, 1),
    "fsdp-w2": ("fsdp", 2, 1),
}
# median samples/s of each measured cell (global, over all ranks)
SPS = {
    "single-t1": 1000.0,
    "single-t2": 1600.0,
    "ddp-w1": 1500.0,
    "ddp-w2": 1200.0,  # loses to single-t2 at batch 64 ...
    "fsdp-w2": 1100.0,
    "single-t1-b256": 1200.0,
    "single-t2-b256": 2000.0,
    "ddp-w1-b256": 1900.0,
    "ddp-w2-b256": 2200.0,  # ... and wins at 256
    "fsdp-w2-b256": 2100.0,
    "single-t1-bf16": 1500.0,
    "single-t2-bf16": 2400.0,
    "ddp-w1-bf16": 2100.0,
    "ddp-w2-bf16": 3000.0,  # the fastest cell; bf16 buys most here (2.5x)
    "fsdp-w2-bf16": 1650.0,
    "single-t1-compiled": 1250.0,  # 64 ms -> 51.2 ms per step
    "ddp-w2-compiled": 1100.0,  # slower than eager: never pays back
}
COMPILE_S = {"single-t1-compiled": 2.56, "ddp-w2-compiled": 1.0}
NUM_PARAMS = 1_000_000
SPREAD = (0.98, 1.0, 1.02)  # per-repeat factors: a 4% spread, not noisy


def speedup_cfg(**override):
    speedup = {"batch_sizes": [64, 256], "precisions": ["fp32", "bf16", "fp16"], "compile": [False, True]}
    return parse_params(tiny_params(speedup={**speedup, **override}, tracking={"enabled": False}), "test")


def cell_of(name: str) -> Cell:
    base = next(s for s in sorted(SETUPS, key=len, reverse=True) if name.startswith(s))
    strategy, world, threads = SETUPS[base]
    precision = "bf16" if "-bf16" in name else "fp16" if "-fp16" in name else "fp32"
    batch = 256 if name.endswith("-b256") else 64
    reason = FP16_REASON if precision == "fp16" else ""
    return Cell(name, strategy, world, threads, "cpu", 1, precision, "-compiled" in name, batch, reason)


def result(cell: Cell, sps: float, factors=SPREAD, new_fields: bool = True) -> dict:
    global_batch = cell.batch_size * cell.world_size
    repeats = [sps * f for f in factors]
    res = {
        "status": "ok",
        "cached": False,
        "key": "k",
        "repeat_s": [global_batch * 5 / s for s in repeats],
        "timed_steps": 5,
        "global_batch": global_batch,
        "step_time_ms": [1000.0 * global_batch / s for s in repeats],
        "samples_per_s": repeats,
        "num_params": NUM_PARAMS,
        "grad_bytes": 4 * NUM_PARAMS,
    }
    if new_fields:
        shard = cell.world_size if cell.strategy == "fsdp" else 1
        res.update(
            first_step_s=COMPILE_S.get(cell.name, 0.0) + global_batch / sps,
            compile_s=COMPILE_S.get(cell.name) if cell.compile else None,
            peak_mem_bytes_per_rank=30 * 2**20 // shard,
            mem_kind="rss_growth",
            param_bytes_per_rank=4 * NUM_PARAMS // shard,
            grad_bytes_per_rank=4 * NUM_PARAMS // shard,
            optim_bytes_per_rank=0,
        )
    return res


def grid(sps: dict[str, float] | None = None, new_fields: bool = True) -> tuple[list[Cell], dict[str, dict]]:
    sps = {**SPS, **(sps or {})}
    cells = [cell_of(n) for n in [*sps, "ddp-w2-fp16"]]
    results = {c.name: result(c, sps[c.name], new_fields=new_fields) for c in cells if not c.skipped}
    results["ddp-w2-fp16"] = {"status": "skipped", "reason": FP16_REASON}
    return cells, results


def frame_of(cfg=None, **kw) -> pd.DataFrame:
    cells, results = grid(**kw)
    return measured.table((cfg or speedup_cfg()).speedup, cells, results, None)


def write(tmp_path, cfg=None, cells=None, results=None, comm=None):
    if cells is None:
        cells, results = grid()
    report.write(cfg or speedup_cfg(), cells, results, comm, {"env.cpu": "test", "env.cpu_cores": "2"}, tmp_path)
    return pd.read_csv(tmp_path / "speedup.csv").set_index("name"), (tmp_path / "speedup.md").read_text()


def answer(md: str, number: int) -> str:
    section = md.split("## Answers\n")[1].split("\n## ")[0]
    return next(line for line in section.splitlines() if line.startswith(f"{number}. "))


def test_csv_has_the_new_axes_memory_and_compile_columns(tmp_path):
    frame, _ = write(tmp_path)
    new = {"precision", "compile", "batch_size", "compile_s", "break_even_steps", "noisy", "mem_kind"}
    new |= {f"{m}_ci_{end}" for m in ("speedup", "efficiency") for end in ("low", "high")}
    new |= {f"{m}_bytes_per_rank" for m in ("peak_mem", "param", "grad", "optim")}
    assert new <= set(frame.columns)
    row = frame.loc["ddp-w2-bf16"]
    assert (row.precision, bool(row["compile"]), row.batch_size) == ("bf16", False, 64)
    assert frame.loc["fsdp-w2", "param_bytes_per_rank"] == 2 * NUM_PARAMS  # half of ddp-w2's
    assert frame.loc["ddp-w2", "param_bytes_per_rank"] == 4 * NUM_PARAMS
    assert frame.loc["ddp-w2-fp16", "status"] == "skipped" and "CUDA" in frame.loc["ddp-w2-fp16", "reason"]


def test_speedup_is_against_the_fp32_eager_single_at_the_same_batch():
    frame = frame_of().set_index("name")
    assert frame.loc["ddp-w2-b256", "speedup"] == pytest.approx(2200 / 1200)  # single-t1-b256, not single-t1
    assert frame.loc["ddp-w2-b256", "speedup_vs_single_all"] == pytest.approx(2200 / 2000)
    assert frame.loc["ddp-w2-bf16", "speedup"] == pytest.approx(3000 / 1000)  # bf16 and 2 ranks together
    assert frame.loc["single-t1-compiled", "speedup"] == pytest.approx(1.25)
    assert frame.loc["ddp-w2-b256", "efficiency"] == pytest.approx(2200 / 1200 / 2)


def test_the_default_grid_keeps_todays_figures():
    cfg = speedup_cfg(batch_sizes=[64], precisions=["fp32"], compile=[False])
    names = list(SETUPS)
    frame = frame_of(cfg, sps={}).set_index("name").loc[names]
    for name in names:
        row = frame.loc[name]
        assert row.speedup == pytest.approx(SPS[name] / SPS["single-t1"])
        assert row.speedup_vs_single_all == pytest.approx(SPS[name] / SPS["single-t2"])
        # from the numbers put in, not from the speedup column the code computed
        assert row.efficiency == pytest.approx(SPS[name] / SPS["single-t1"] / SETUPS[name][1])


def test_break_even_is_compile_time_over_the_step_time_saved():
    frame = frame_of().set_index("name")
    # eager 64 ms, compiled 51.2 ms: 2.56 s / 12.8 ms = 200 steps
    assert frame.loc["single-t1-compiled", "compile_s"] == pytest.approx(2.56)
    assert frame.loc["single-t1-compiled", "break_even_steps"] == pytest.approx(200.0)
    assert math.isnan(frame.loc["ddp-w2-compiled", "break_even_steps"])  # compiled is slower
    assert math.isnan(frame.loc["single-t1", "break_even_steps"]) and math.isnan(frame.loc["single-t1", "compile_s"])


def test_bootstrap_intervals_contain_the_estimate_and_repeat():
    first, second = frame_of(), frame_of()
    ok = first[first.status == "ok"]
    for column in ("speedup", "efficiency", "speedup_vs_single_all"):
        low, high = ok[f"{column}_ci_low"], ok[f"{column}_ci_high"]
        assert (low <= ok[column] + 1e-12).all() and (ok[column] <= high + 1e-12).all(), column
        assert (low < high).all(), column  # 4% spread: a real interval, not a point
    pd.testing.assert_frame_equal(first, second)


def test_bootstrap_interval_of_a_known_case_is_reproducible():
    # a constant baseline: the ratio is the median of 3 draws from {900, 1000, 1100} over 1000, which
    # is 0.9 (or 1.1) with probability 7/27 each: far more than the 2.5% in each tail
    low, high = measured.bootstrap_ratio(np.array([900.0, 1000.0, 1100.0]), np.full(3, 1000.0))
    assert (low, high) == pytest.approx((0.9, 1.1))
    cell, base = np.linspace(1000, 1300, 101), np.linspace(900, 1000, 101)  # fine-grained: draws differ
    assert measured.bootstrap_ratio(cell, base) == measured.bootstrap_ratio(cell, base)  # fixed seed


def test_noisy_flips_above_a_ten_percent_spread():
    cells, results = grid()
    quiet, loud = cell_of("single-t2"), cell_of("ddp-w1")
    results[quiet.name] = result(quiet, 1600.0, factors=(0.955, 1.0, 1.045))  # 9% spread
    results[loud.name] = result(loud, 1500.0, factors=(0.945, 1.0, 1.055))  # 11% spread
    frame = measured.table(speedup_cfg().speedup, cells, results, None).set_index("name")
    quiet_flag = frame.loc["single-t2", "noisy"]
    assert isinstance(quiet_flag, (bool, np.bool_)) and not quiet_flag
    loud_flag, base_flag = frame.loc["ddp-w1", "noisy"], frame.loc["single-t1", "noisy"]
    assert isinstance(loud_flag, (bool, np.bool_)) and loud_flag  # read here, not by measured.is_noisy
    assert isinstance(base_flag, (bool, np.bool_)) and not base_flag


def test_article_table_names_threads_and_keeps_to_the_reference_axes(tmp_path):
    _, md = write(tmp_path)
    article = md.split("## The article's table\n")[1].split("\n## ")[0]
    rows = [line for line in article.splitlines() if line.startswith("| ") and "setup" not in line]
    assert len(rows) == len(SETUPS)  # batch 64, fp32, eager only
    assert any(r.startswith("| DDP, 1 process x 2 threads | ") for r in rows)
    assert any(r.startswith("| DDP, 2 processes x 1 thread | ") for r in rows)
    assert any(r.startswith("| FSDP, 2 processes x 1 thread | ") for r in rows)
    assert any(r.startswith("| single process (2 threads) | ") for r in rows)
    ddp_w2 = next(r for r in rows if r.startswith("| DDP, 2 processes"))
    assert "1.20x [" in ddp_w2  # speedup with its interval


def test_answers_name_the_cells_they_come_from(tmp_path):
    _, md = write(tmp_path)
    assert answer(md, 1).startswith("1. Fastest setup: `ddp-w2-bf16`")
    best = answer(md, 2)
    assert "1: `single-t2`" in best and "2: `ddp-w2`" in best
    bf16 = answer(md, 3)
    assert "best 2.50x (`ddp-w2-bf16` vs `ddp-w2`)" in bf16 and "median 1.50x over 5 pair(s)" in bf16
    assert answer(md, 4).startswith("4. What fp16 buys: not measured (fp16 needs CUDA")
    compiled = answer(md, 5)
    assert "best 1.25x (`single-t1-compiled` vs `single-t1`)" in compiled and "after 200 steps" in compiled
    assert "`ddp-w2`: measured between batch 64 and 256" in answer(md, 6)
    memory = answer(md, 7)
    assert "`fsdp-w2` peak 15.0 MiB" in memory and "= 3.8 MiB" in memory  # (2 + 2 + 0) MB of state


def test_bf16_and_compile_not_measured_say_so(tmp_path):
    cfg = speedup_cfg(precisions=["fp32"], compile=[False])
    cells, results = grid()
    keep = [c for c in cells if c.precision == "fp32" and not c.compile]
    _, md = write(tmp_path, cfg, keep, {c.name: results[c.name] for c in keep})
    assert answer(md, 3) == "3. What bf16 buys: not measured."
    assert answer(md, 4) == "4. What compile buys: not measured."


def test_measured_crossover_brackets_the_first_winning_batch():
    bracket = batch_view.batch_table(frame_of(), grid()[1])
    won = batch_view.measured_crossover(bracket[bracket["name"].str.startswith("ddp-w2")])
    assert (won["measured_lose_batch"], won["measured_win_batch"]) == (64, 256)
    frame = frame_of(sps={"ddp-w2-b256": 1900.0})
    lost = batch_view.batch_table(frame, grid({"ddp-w2-b256": 1900.0})[1])
    never = batch_view.measured_crossover(lost[lost["name"].str.startswith("ddp-w2")])
    assert never["measured"].startswith("not reached in the measured range")
    assert math.isnan(never["measured_win_batch"])


def test_predicted_crossover_solves_the_model():
    rank, singles, allreduce_s = (0.01, 0.001), {"single-t1": (0.01, 0.001), "single-t2": (0.006, 0.0006)}, 0.02

    def wins(b):
        ddp = 2 * b / (rank[0] + rank[1] * b + allreduce_s)
        return all(ddp > b / (a + c * b) for a, c in singles.values())

    batch, text = batch_view.predicted_crossover(2, rank, singles, allreduce_s)
    assert batch == 91 == next(b for b in range(1, 10_000) if wins(b))  # vs single-t2: b > 0.018 / 0.0002
    assert text == "from batch 91"
    never, why = batch_view.predicted_crossover(2, rank, {"fast": (0.0, 0.0004)}, allreduce_s)
    assert math.isnan(never) and "not predicted" in why


def test_crossover_prediction_needs_a_link_and_two_batches():
    cfg = speedup_cfg().speedup
    frame = frame_of()
    bracket = batch_view.batch_table(frame, grid()[1])
    link = comm_model.Link(bandwidth_b_s=1e8, latency_s=0.0)  # 4 MB of gradients: 40 ms at 2 ranks
    cross = batch_view.crossover(cfg, frame, bracket, link, 4 * NUM_PARAMS).set_index("world_size")
    fits = {
        t: batch_view.fit_line([64, 256], [64 / (SPS[f"single-t{t}"]), 256 / SPS[f"single-t{t}-b256"]]) for t in (1, 2)
    }
    expected, _ = batch_view.predicted_crossover(2, fits[1], {f"t{t}": f for t, f in fits.items()}, 0.04)
    assert cross.loc[2, "predicted_batch"] == expected and cross.loc[2, "predicted"] == f"from batch {int(expected)}"
    unlinked = batch_view.crossover(cfg, frame, bracket, None, 4 * NUM_PARAMS)
    assert unlinked.predicted.iloc[0].startswith("no prediction: no fitted link")


def test_one_batch_size_writes_the_batch_csv_and_says_the_crossover_needs_two(tmp_path):
    cfg = speedup_cfg(batch_sizes=[64], precisions=["fp32"], compile=[False])
    cells, results = grid()
    keep = [c for c in cells if c.batch_size == 64 and c.precision == "fp32" and not c.compile]
    write(tmp_path, cfg, keep, {c.name: results[c.name] for c in keep})
    rows = pd.read_csv(tmp_path / "speedup_batch.csv")
    assert sorted(rows["name"]) == ["ddp-w1", "ddp-w2", "fsdp-w2"]
    cross = pd.read_csv(tmp_path / "speedup_crossover.csv")
    assert cross.measured.iloc[0] == "needs >= 2 batch sizes"
    assert cross.predicted.iloc[0] == "no prediction: no fitted link (the all-reduce benchmark did not run)"
    assert (tmp_path / "speedup_batch.png").read_bytes()[:4] == b"\x89PNG"


def test_batch_csv_rows_compare_with_the_best_single_and_the_same_threads(tmp_path):
    write(tmp_path)
    rows = pd.read_csv(tmp_path / "speedup_batch.csv").set_index("name")
    assert sorted(rows.index) == sorted(f"{s}{b}" for s in ("ddp-w1", "ddp-w2", "fsdp-w2") for b in ("", "-b256"))
    top = rows.loc["ddp-w2-b256"]
    assert top.best_single == "single-t2-b256" and top.speedup_vs_best_single == pytest.approx(2200 / 2000)
    assert top.same_threads_single == "single-t1-b256" and top.efficiency == pytest.approx(2200 / (2 * 1200))
    assert rows.loc["ddp-w1", "efficiency"] == pytest.approx(1500 / 1600)  # 2 threads: against single-t2
    assert (rows.speedup_ci_low <= rows.speedup_vs_best_single).all()


def test_results_without_the_new_fields_still_report(tmp_path):
    cells, results = grid(new_fields=False)
    frame, md = write(tmp_path, cells=cells, results=results)
    assert frame.peak_mem_bytes_per_rank.isna().all() and frame.compile_s.isna().all()
    assert "Memory per rank: not measured" in answer(md, 7)
    assert frame.loc["ddp-w2-bf16", "speedup"] == pytest.approx(3.0)


def test_figure_uses_integer_worker_ticks_and_like_for_like_efficiency(tmp_path):
    cfg = speedup_cfg().speedup
    fig = plots.plot(cfg, frame_of(), tmp_path / "speedup.png")
    throughput, efficiency, *axis_panels = fig.axes
    assert len(axis_panels) == 2  # a precision panel and a compile panel
    for ax in (throughput, efficiency):
        ticks = list(ax.get_xticks())
        assert ticks == [1, 2] and all(float(t).is_integer() for t in ticks)
    ddp = next(line for line in efficiency.lines if line.get_label() == "DDP measured")
    assert list(ddp.get_ydata()) == pytest.approx([1500 / 1600, 1200 / (2 * 1000)])  # world 1 vs single-t2
    assert efficiency.get_ylim()[1] >= max(ddp.get_ydata())
    references = {line.get_label(): line.get_ydata()[0] for line in throughput.lines}
    assert references["single-t1"] == 1000.0 and references["single-t2"] == 1600.0


def test_batch_figure_ticks_are_the_measured_batches(tmp_path):
    frame = frame_of()
    fig = plots.plot_batch(frame, batch_view.batch_table(frame, grid()[1]), tmp_path / "speedup_batch.png")
    for ax in fig.axes:
        assert list(ax.get_xticks()) == [64, 256]


@pytest.mark.integration  # a real MLflow store: its schema, a parent and a child run per cell
def test_mlflow_children_carry_the_axes_and_the_parent_the_batch_files(workdir, store_ready):
    from mlflow import MlflowClient

    cells, results = grid()
    cfg = parse_params(tiny_params(speedup={"batch_sizes": [64, 256], "precisions": ["fp32", "bf16", "fp16"]}), "t")
    out = workdir / "out"
    out.mkdir()
    report.write(cfg, cells, results, None, {"env.cpu": "test"}, out)
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("scalelab")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`scalelab.kind` = 'study'")
    assert {"speedup_batch.csv", "speedup_batch.png", "speedup_crossover.csv"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)
    }
    children = client.search_runs([exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    child = next(c for c in children if c.info.run_name == "single-t1-compiled-seed0")
    assert (child.data.params["precision"], child.data.params["compile"], child.data.params["batch_size"]) == (
        "fp32",
        "True",
        "64",
    )
    assert child.data.metrics["compile_s"] == pytest.approx(2.56)
    assert child.data.metrics["peak_mem_bytes_per_rank"] == 30 * 2**20
    assert child.data.metrics["break_even_steps"] == pytest.approx(200.0)


def test_headline_and_summary_give_the_interval_and_say_noisy(tmp_path):
    from scalelab.cli.summary import summary

    cfg = speedup_cfg()
    quiet = report.headline(cfg.speedup, frame_of())
    assert "noisy" not in quiet["headline"] and quiet["noisy"] is False
    low, high = quiet["ddp_speedup_ci_low"], quiet["ddp_speedup_ci_high"]
    assert low <= quiet["ddp_speedup"] <= high and low < high
    assert f"{quiet['ddp_speedup']:.2f}x [{low:.2f}, {high:.2f}]" in quiet["headline"]

    cells, results = grid()
    ddp = cell_of("ddp-w2")
    results[ddp.name] = result(ddp, SPS["ddp-w2"], factors=(0.8, 1.0, 1.2))  # a 40% spread
    loud = report.headline(cfg.speedup, measured.table(cfg.speedup, cells, results, None))
    assert loud["noisy"] is True and loud["headline"].endswith("noisy: the repeats spread by more than 10%")
    (tmp_path / "speedup").mkdir()
    (tmp_path / "speedup/speedup.json").write_text(json.dumps(loud))
    assert f"speedup study   {loud['headline']}" in summary(tmp_path)


def test_activation_checkpointing_answer_compares_each_ac_cell_with_its_twin(tmp_path):
    cfg = speedup_cfg(batch_sizes=[64], precisions=["fp32"], compile=[False], activation_checkpointing=[False, True])
    cells = [cell_of(n) for n in ("single-t1", "ddp-w2")]
    cells += [dataclasses.replace(c, name=f"{c.name}-ac", activation_checkpointing=True) for c in cells]
    results = {c.name: result(c, SPS[c.name.removesuffix("-ac")] * (0.8 if c.activation_checkpointing else 1))
               for c in cells}  # fmt: skip
    results["ddp-w2-ac"]["peak_mem_bytes_per_rank"] = 18 * 2**20  # 30 MiB without: -40%
    frame, md = write(tmp_path, cfg, cells, results)
    on = {"single-t1": False, "ddp-w2": False, "single-t1-ac": True, "ddp-w2-ac": True}
    assert frame.activation_checkpointing.astype(bool).to_dict() == on
    line = next(ln for ln in md.splitlines() if "What activation checkpointing saves" in ln)
    assert "`ddp-w2-ac` peak 18.0 MiB per rank vs 30.0 MiB (`ddp-w2`, -40%) at 0.80x the throughput" in line, line
    assert "`single-t1-ac` peak 30.0 MiB per rank vs 30.0 MiB (`single-t1`, +0%)" in line, line
    assert frame.loc["ddp-w2-ac", "speedup"] == pytest.approx(0.8 * SPS["ddp-w2"] / SPS["single-t1"])  # vs single-t1


def test_a_speedup_no_core_count_allows_is_invalid_and_no_headline_or_answer_states_it(tmp_path):
    """The busy machine of issue 30: single-t1 measured while another process held a core, so ddp-w2
    on 2 cores shows 5.35x and fsdp-w2 7.19x of it. Neither is a number anywhere; a cell within its
    cores' ratio (single-t2: 1.6x on 2 cores) stays."""
    from scalelab.cli.summary import summary

    busy = {"single-t1": 300.0, "ddp-w2": 1605.0, "fsdp-w2": 2157.0}
    cells, results = grid(busy)
    frame, md = write(tmp_path, cells=cells, results=results)
    assert frame.loc["ddp-w2", "status"] == "invalid" and frame.loc["fsdp-w2", "status"] == "invalid"
    assert "machine busy: faster than 2x the cores or devices of single-t1 allow" in frame.loc["ddp-w2", "reason"]
    assert np.isnan(frame.loc["ddp-w2", "speedup"]) and np.isnan(frame.loc["fsdp-w2", "efficiency"])
    assert frame.loc["ddp-w2-b256", "status"] == "ok"  # its own twin (single-t1-b256) was measured fairly
    head = json.loads((tmp_path / "speedup.json").read_text())
    assert head["headline"].startswith("not measured:") and "rerun on an idle machine" in head["headline"]
    assert "ddp_speedup" not in head and head["invalid_cells"] >= 3  # single-t2, ddp-w1 too: over 300 x 2.2
    assert "7.19" not in md and "5.35x [" not in md and "Left out of every answer" in md
    assert "fsdp-w2`" not in answer(md, 1)  # the fastest setup is a valid cell
    assert "not measured:" in summary(_results_of(tmp_path))


def _results_of(out):
    """A results/ folder whose speedup/speedup.json is `out`'s (what `scalelab summary` reads)."""
    results = out / "results"
    (results / "speedup").mkdir(parents=True)
    (results / "speedup/speedup.json").write_text((out / "speedup.json").read_text())
    return results


def test_fair_cells_on_the_machine_they_used_stay_valid():
    frame = frame_of()
    assert set(frame.status) == {"ok", "skipped"}, frame[["name", "status", "reason"]]


def test_compile_time_is_net_of_the_eager_twins_first_step():
    cfg = speedup_cfg()
    cells, results = grid()
    results["single-t1"]["first_step_s"] += 0.4  # every first step's own cost (handles, lazy kernels), eager too
    frame = measured.table(cfg.speedup, cells, results, None).set_index("name")
    assert frame.loc["single-t1-compiled", "compile_s"] == pytest.approx(2.56 - 0.4)
    assert frame.loc["single-t1-compiled", "break_even_steps"] == pytest.approx((2.56 - 0.4) / 0.0128)
    del results["single-t1"]  # no eager twin measured: the compiled cell's own excess, an upper bound
    cells = [c for c in cells if c.name != "single-t1"]
    frame = measured.table(cfg.speedup, cells, results, None).set_index("name")
    assert frame.loc["single-t1-compiled", "compile_s"] == pytest.approx(2.56)
