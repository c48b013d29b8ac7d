"""The speedup study: the grid of cells (`plan`), what runs inside a cell (`cell`), running and
caching the cells (`run`), the all-reduce model (`comm_model`) and the outputs (`report`).

Owns: single process vs DataParallel vs DDP at N workers, measured side by side. Imports training
(the same step loop as `scalelab train`), launch, tracking, config and runtime.
"""
