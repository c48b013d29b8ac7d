"""Benchmarks that write JSON figures under results/bench/ (`make bench` runs them all).

    scalelab bench tracking --out results/bench     # tracking overhead -> tracking_overhead.json
    scalelab bench all --out results/bench          # every benchmark with its defaults

`scalelab bench NAME --help` lists a benchmark's own options.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from scalelab import bench_tracking

log = logging.getLogger(__name__)
# name -> module with add_arguments(parser) and run(args, out_dir) -> dict
BENCHMARKS = {"tracking": bench_tracking}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scalelab bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="name", required=True)
    for name, module in BENCHMARKS.items():
        p = sub.add_parser(name, help=(module.__doc__ or "").split("\n")[0])
        p.add_argument("--out", default="results/bench")
        module.add_arguments(p)
    sub.add_parser("all", help="every benchmark with its defaults").add_argument("--out", default="results/bench")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the chosen benchmark(s); prints one headline line each. Returns the exit status."""
    args = _parser().parse_args(argv)
    names = list(BENCHMARKS) if args.name == "all" else [args.name]
    for name in names:
        module = BENCHMARKS[name]
        bench_args = args if args.name == name else _defaults(module)
        result = module.run(bench_args, Path(args.out))
        print(headline(name, result, Path(args.out)))
    return 0


def _defaults(module) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args([])


def headline(name: str, result: dict, out: Path) -> str:
    """One line with the figures and their units."""
    if name == "tracking":
        med = result["median_step_ms"]
        return (f"tracking overhead: {result['overhead_pct']:+.2f}% median step time "
                f"(off {med['off']:.2f} ms, batched {med['batched']:.2f} ms, amortized ratio "
                f"{result['amortized_overhead_ratio']:.4f}; sync log_metric {med['sync']:.2f} ms/step, "
                f"{result['sync_log_metric_ms_median']:.2f} ms/call) -> {out / bench_tracking.OUT_FILE}")
    return f"{name}: done -> {out}"
