"""The GPT workload on real text: the CPython standard library's own .py files (text that ships with
every Python and that nobody here wrote), byte tokens, through `dvc repro` (a gpt run's `scalelab
reproduce`, bits per byte compared: the README's gpt command, tests/reproduce/test_readme_experiments.py);
and a stop mid-epoch on token data resumes bitwise."""

import json
import math
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow import MlflowClient
from test_resume import StopAtCheck

from helpers import run_cli, tiny_params, train_here, training_pipeline, write_params
from scalelab.config import load_params

STDLIB = Path(sysconfig.get_paths()["stdlib"])
GPT = {"vocab_size": 256, "seq_len": 64, "d_model": 64, "layers": 2, "heads": 2}


def copy_stdlib(dest: Path, pattern: str, max_bytes: int | None = None) -> list[Path]:
    """The standard library's top-level files matching `pattern` (smaller than max_bytes), copied."""
    dest.mkdir(parents=True)
    picked = [p for p in sorted(STDLIB.glob(pattern)) if max_bytes is None or p.stat().st_size < max_bytes]
    for path in picked:
        shutil.copyfile(path, dest / path.name)
    return picked


def unigram_entropy_bits(tokens: np.ndarray) -> float:
    """Entropy of the byte distribution itself: what a model that ignores context can reach."""
    p = np.bincount(tokens, minlength=256) / len(tokens)
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


@pytest.mark.integration  # three training jobs in this process: about 10 s
def test_stop_mid_epoch_then_resume_on_text_is_bitwise_identical(workdir):
    copy_stdlib(workdir / "corpus", "[a-c]*.py", max_bytes=8_000)
    tiny = {"vocab_size": 256, "seq_len": 16, "d_model": 16, "layers": 1, "heads": 2, "dropout": 0.1}
    write_params(
        workdir / "p.yaml",
        tiny_params(
            data={"source": "text", "text": {"path": str(workdir / "corpus")}},
            train={"workload": "gpt", "model": tiny, "strategy": "single", "nproc_per_node": 1, "batch_size": 16},
            tracking={"enabled": False},
            slurm={"stop_check_every_steps": 1},
        ),
    )
    params = load_params(workdir / "p.yaml")
    from scalelab.data.prepare import prepare

    prepare(params.data, workdir / "prepared", seq_len=16)
    ref = train_here(params, workdir / "prepared", workdir / "ref")
    per_epoch = ref["total_steps"] // params.train.epochs
    stop_at = per_epoch + per_epoch // 3  # mid-epoch 2
    stopped = train_here(params, workdir / "prepared", workdir / "pre", stop=StopAtCheck(stop_at))
    assert stopped["preempted"] and stopped["step"] == stop_at
    train_here(params, workdir / "prepared", workdir / "pre")
    a = torch.load(workdir / "ref/model.pt", weights_only=True)["model"]
    b = torch.load(workdir / "pre/model.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.integration
def test_gpt_learns_the_standard_library_through_dvc_repro(repo_copy):
    files = copy_stdlib(repo_copy / "data/raw/stdlib", "[m-p]*.py")  # 30 files, 0.97 MB on 3.11
    assert sum(p.stat().st_size for p in files) > 500_000
    params = tiny_params(
        data={"source": "text", "text": {"path": "data/raw/stdlib", "pattern": "*.py"}},
        train={"workload": "gpt", "model": GPT, "epochs": 1, "batch_size": 16, "lr": 3e-3, "log_every_steps": 10},
        tracking={"system_metrics_interval_s": 0},
    )
    training_pipeline(repo_copy, params, commit=True)  # prepare -> train (ddp, 2 ranks) -> evaluate
    run_cli("dvc", "repro", cwd=repo_copy, timeout=1800)

    metrics = json.loads((repo_copy / "results/eval/metrics.json").read_text())
    assert {"test_loss", "perplexity", "bits_per_byte"} <= set(metrics) and "test_accuracy" not in metrics
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["test_loss"]), rel=1e-9)
    assert metrics["bits_per_byte"] == pytest.approx(metrics["test_loss"] / math.log(2), rel=1e-9)  # 1 byte/token
    run_id = json.loads((repo_copy / "results/train/run.json").read_text())["run_id"]
    client = MlflowClient(f"sqlite:///{repo_copy / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.data.tags["scalelab.strategy"] == "ddp" and run.data.params["world_size"] == "2"
    assert run.data.metrics["bits_per_byte"] == metrics["bits_per_byte"]
    assert run.data.metrics["perplexity"] == metrics["perplexity"]
    steps = [m.step for m in client.get_metric_history(run_id, "train_loss")]
    assert 200 <= steps[-1] <= 500, steps[-1]  # a few hundred steps

    val = np.load(repo_copy / "data/prepared/val.tokens.npy")
    entropy = unigram_entropy_bits(val)  # of the very text the val figure is measured on
    val_bpb = run.data.metrics["val_bits_per_byte"]
    print(f"val {val_bpb:.3f} bits/byte against a unigram entropy of {entropy:.3f} over {len(val)} bytes")
    assert val_bpb < 0.8 * entropy, (val_bpb, entropy)

    samples = [a.path for a in client.list_artifacts(run_id, "samples")]  # one file per validation
    assert samples == [f"samples/step-{steps[-1]:06d}.txt"], samples
    logged = open(client.download_artifacts(run_id, samples[0], str(repo_copy / ".."))).read()
    assert logged.count("--- sample ") == 2 and len(logged) > 2 * 64, logged
    sampled = [
        run_cli(
            "sample",
            "--run",
            run_id,
            "--best",
            "--prompt",
            "def ",
            "--tokens",
            "80",
            "--seed",
            str(seed),
            cwd=repo_copy,
        )
        for seed in (1, 1, 2)
    ]
    assert sampled[0].stdout == sampled[1].stdout != sampled[2].stdout and sampled[0].stdout.startswith("def ")
