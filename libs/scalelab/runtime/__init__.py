"""What every layer uses: the distributed environment (`dist`), device and thread setup
(`device`), seeds (`seeds`), signals (`signals`), a worker that never outlives its launcher
(`lifeline`), atomic writes and hashes (`io`), phase timestamps for the start-up benchmark
(`timings`), the timed-repeats loop of the study's cells and the benchmarks (`repeats`), and
repository paths with the code each stage depends on (`paths`).

Owns: process-level facts and primitives that know nothing about models, params or tracking.
Imports nothing from scalelab outside this package.
"""
