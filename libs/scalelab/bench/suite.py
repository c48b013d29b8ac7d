"""`scalelab bench`: benchmarks that write JSON figures under results/bench/.

    scalelab bench tracking --out results/bench     # tracking overhead -> tracking_overhead.json
    scalelab bench all --out results/bench          # every benchmark with its defaults

`scalelab bench NAME --help` lists a benchmark's own options.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scalelab.bench import scaling, startup, tracking_cost

# name -> module with add_arguments(parser), run(args, out_dir) -> dict and headline(result, out) -> str
BENCHMARKS = {"tracking": tracking_cost, "startup": startup, "scaling": scaling}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="name", required=True)
    for name, module in BENCHMARKS.items():
        p = sub.add_parser(name, help=(module.__doc__ or "").split("\n")[0])
        p.add_argument("--out", default="results/bench")
        module.add_arguments(p)
    sub.add_parser("all", help="every benchmark with its defaults").add_argument("--out", default="results/bench")


def run(args: argparse.Namespace) -> int:
    """Runs the chosen benchmark(s); prints one headline line each."""
    names = list(BENCHMARKS) if args.name == "all" else [args.name]
    for name in names:
        module = BENCHMARKS[name]
        bench_args = args if args.name == name else _defaults(module)
        result = module.run(bench_args, Path(args.out))
        print(module.headline(result, Path(args.out)))
    return 0


def _defaults(module) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args([])
