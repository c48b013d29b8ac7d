"""`scalelab validate`: the whole params file, checked, as the pipeline's first stage.

    scalelab validate --params params.yaml --out results/validate.json

DVC removes a stage's outputs before it runs the stage's command. Every other stage depends on this
one's output, so a params file that the loader refuses stops `dvc repro` here, before any result
of the last good run is removed. The output is the same for every valid file: rerunning this stage
never reruns another one; each stage still reruns on its own params (dvc.yaml).
"""

from __future__ import annotations

import argparse

VALID = {"params": "valid"}  # constant on purpose (see above)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml", help="the params file to check (default: params.yaml)")
    parser.add_argument(
        "--out",
        required=True,
        help="the JSON file to write (results/validate.json in dvc.yaml); written only when every section is valid",
    )


def run(args: argparse.Namespace) -> int:
    from scalelab.config import ConfigError, load_params
    from scalelab.config.schema import resume_from_error, resume_from_problem
    from scalelab.runtime.io import atomic_write_json
    from scalelab.runtime.paths import repo_root

    params = load_params(args.params)
    problem = resume_from_problem(params.train.resume_from, repo_root())  # a folder the train stage needs
    if problem is not None:
        raise ConfigError(f"{args.params}: {resume_from_error(params.train.resume_from, problem, [])}")
    atomic_write_json(args.out, VALID)
    print(f"{args.params}: every section is valid")
    return 0
