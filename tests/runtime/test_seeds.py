"""Seed derivation: stable, distinct per rank and per worker."""

from scalelab.runtime import seeds


def test_rank_and_worker_seeds_are_stable_and_distinct():
    assert seeds.rank_seed(0, 1) == seeds.rank_seed(0, 1)
    ranks = {seeds.rank_seed(0, r) for r in range(64)}
    workers = {seeds.worker_seed(0, r, w) for r in range(8) for w in range(8)}
    assert len(ranks) == 64 and len(workers) == 64
    assert seeds.rank_seed(1, 0) != seeds.rank_seed(0, 0)


def test_ledger_lists_every_rank():
    ledger = seeds.ledger(7, world_size=4, num_workers=2, deterministic=True)
    assert ledger["base_seed"] == 7 and len(ledger["rank_seeds"]) == 4
    assert len(ledger["worker_seeds"]) == 8 and ledger["deterministic_algorithms"] is True
