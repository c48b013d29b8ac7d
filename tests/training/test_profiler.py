"""Profiling on 2 DDP ranks: every rank's Chrome trace and key_averages tables reach MLflow."""

import gzip
import json
import shutil

import pytest
from mlflow import MlflowClient

from helpers import once_more_if_heap_crash, run_cli, tiny_params, write_params

pytestmark = pytest.mark.integration


def plant_stale(workdir):
    stale = workdir / "results/train/profile"  # an earlier run's files must not be logged
    stale.mkdir(parents=True)
    (stale / "trace-rank7.json.gz").write_bytes(b"stale")
    (stale / "key_averages-rank0.txt").write_text("stale")


@pytest.mark.slow  # a profiled training job
def test_every_rank_trace_is_logged_loads_and_has_its_size(workdir, prepared_digits, tmp_path):
    plant_stale(workdir)
    write_params(
        workdir / "params.yaml",
        tiny_params(
            train={"profile": {"enabled": True, "wait": 1, "warmup": 1, "active": 2}},
            tracking={"system_metrics_interval_s": 0},
        ),
    )
    args = ("train", "--data", str(prepared_digits), "--out", "results/train")

    def tidy():
        shutil.rmtree(workdir / "results/train")
        (workdir / "mlflow.db").unlink()
        plant_stale(workdir)

    once_more_if_heap_crash(lambda: run_cli(*args, cwd=workdir, timeout=600), tidy)

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("scalelab").experiment_id])[0]
    sizes = {a.path: a.file_size for a in client.list_artifacts(run.info.run_id, "profile")}
    per_rank = ("trace-rank{}.json.gz", "key_averages-rank{}.txt", "key_averages-rank{}.csv")
    assert set(sizes) == {f"profile/{name.format(rank)}" for rank in (0, 1) for name in per_rank}
    for rank in (0, 1):
        path = client.download_artifacts(run.info.run_id, f"profile/trace-rank{rank}.json.gz", str(tmp_path))
        with gzip.open(path, "rt") as fh:
            events = json.load(fh)["traceEvents"]
        names = {e.get("name", "") for e in events if e.get("ph") == "X"}
        assert any(n.startswith("ProfilerStep#") for n in names), sorted(names)[:20]
        assert any(n.startswith("aten::") for n in names)  # the ops of the active steps
        assert run.data.tags[f"profile.trace_bytes.rank{rank}"] == str(sizes[f"profile/trace-rank{rank}.json.gz"])
        table = client.download_artifacts(run.info.run_id, f"profile/key_averages-rank{rank}.txt", str(tmp_path))
        assert "Self CPU" in open(table).read()
        csv = client.download_artifacts(run.info.run_id, f"profile/key_averages-rank{rank}.csv", str(tmp_path))
        assert open(csv).readline().startswith("name,count,self_cpu_time_us")
    total = sum(sizes[f"profile/trace-rank{r}.json.gz"] for r in (0, 1))
    assert run.data.metrics["profile_trace_bytes"] == total and 0 < total < 5_000_000  # a few steps: small
