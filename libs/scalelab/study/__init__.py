"""The speedup study: the grid of cells (`plan`), what runs inside a cell (`cell`), running and
caching the cells (`run`), the all-reduce model (`comm_model`) and the outputs (`report`, which
writes the per-cell table of `measured`, the batch-size view of `batch`, the answer lines of
`answers` and the figures of `plots`).

Owns: single process vs DataParallel vs DDP vs FSDP at N workers (and precision, compile and batch
size), measured side by side. Imports training (the same step loop as `scalelab train`), launch,
tracking, config and runtime.
"""
