"""Data: `prepare` builds data/prepared/ from params `data.*` (digits, synthetic, or a user file);
`store` verifies the manifest and its hashes and loads a split.

Owns: the prepared-data format and its manifest. Imports config and runtime only.
"""
