"""Data: `prepare` builds data/prepared/ from params `data.*` (digits, synthetic, a CSV/Parquet table,
or a text corpus as byte tokens), streaming its input into memory-mappable `.npy` files (`arrays`),
split by row or by document (`split`); `store` verifies the manifest and its hashes and opens a
split as a dataset object (`Split`: length, batch fetch by indices, manifest entry).

Owns: the prepared-data format and its manifest. Imports config and runtime only.
"""
