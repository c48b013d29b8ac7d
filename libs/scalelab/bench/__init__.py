"""Benchmarks behind `make bench`: each writes `results/bench/<name>.json` (`suite` runs them).

Owns: measuring scalelab's own costs. Benchmarks are not timed tests: `make test` runs each once
at a tiny size. Imports the study, training, tracking, config and runtime.
"""
