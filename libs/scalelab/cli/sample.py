"""`scalelab sample`: text from a trained language model (a token workload such as gpt).

    scalelab sample --checkpoint results/train/best.pt --prompt "def " --tokens 200 --temperature 0.8
    scalelab sample --run 3f2a9c... --best       # the best.pt of the run that a run.json names

The same --seed gives the same text. See `scalelab.training.sampling`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", help="a model.pt or best.pt file")
    which.add_argument("--run", help="an MLflow run id: its model under results/ (train, sweeps), found by run.json")
    parser.add_argument("--best", action="store_true", help="with --run: its best.pt instead of model.pt")
    parser.add_argument("--prompt", default="\n", help="the text to continue (UTF-8; default: a newline)")
    parser.add_argument("--tokens", type=int, default=200, help="tokens (bytes) to sample after the prompt")
    parser.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 takes the likeliest")
    parser.add_argument("--seed", type=int, default=0, help="seeds the sampler: the same seed, the same text")


def model_of_run(run_id: str, best: bool) -> Path:
    """The model file beside the run.json (under results/) that names `run_id`."""
    from scalelab.config import ConfigError
    from scalelab.runtime.paths import repo_root

    results = repo_root() / "results"
    for run_json in sorted(results.glob("train/run.json")) + sorted(results.glob("sweeps/*/*/run.json")):
        if json.loads(run_json.read_text()).get("run_id") == run_id:
            return run_json.parent / ("best.pt" if best else "model.pt")
    raise ConfigError(
        f"--run {run_id}: no run.json under {results} names it; `dvc exp apply` its experiment "
        "(or `dvc checkout` its commit) first, or pass --checkpoint FILE"
    )


def run(args: argparse.Namespace) -> int:
    from scalelab.config import ConfigError
    from scalelab.training.sampling import load_model, sample_text

    if args.tokens < 0 or args.temperature < 0:
        bad = ("--tokens", args.tokens) if args.tokens < 0 else ("--temperature", args.temperature)
        raise ConfigError(f"{bad[0]} {bad[1]} is not allowed: must be >= 0")
    path = Path(args.checkpoint) if args.checkpoint else model_of_run(args.run, args.best)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: run `dvc repro train` first, or give another file")
    wl, info = load_model(path)
    if wl.data != "tokens":
        raise ConfigError(f"{path} holds a {info['workload']!r} model, which does not take tokens: sample needs gpt")
    print(sample_text(wl, args.prompt, args.tokens, args.temperature, args.seed))
    return 0
