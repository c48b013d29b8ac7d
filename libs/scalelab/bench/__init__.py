"""Benchmarks behind `make bench`: each writes `results/bench/<name>.json` (`suite` runs them).

Owns: measuring scalelab's own costs, one declaration per benchmark on one harness (harness.py:
ranks, repeats with busy ones dropped, figures with goals). Benchmarks are not timed tests:
`make test` runs each once at a tiny size. Imports the study, training, tracking, config and runtime.
"""
