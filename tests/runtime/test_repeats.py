"""runtime.repeats: the one timed-repeats loop. A fake clock that only the arms move makes every
time exact, so each test derives its expected seconds from what the arms did, not from the loop."""

import pytest

from scalelab.runtime import repeats


class Clock:
    """perf_counter for the loop: advances only when an arm says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(repeats.time, "perf_counter", fake)
    return fake


@pytest.fixture
def barriers(monkeypatch):
    seen = []
    monkeypatch.setattr(repeats.dist, "barrier", lambda: seen.append("barrier"))
    return seen


def arms_that_log(calls: list, clock: Clock, cost_s: dict[str, float]) -> dict:
    """Arms that record (name, step) and take `cost_s[name] * (step + 1)` seconds of fake time."""

    def arm(name):
        def step(i):
            calls.append((name, i))
            clock.now += cost_s[name] * (i + 1)

        return step

    return {name: arm(name) for name in cost_s}


def test_blocks_of_steps_alternate_their_order_every_repeat(clock, barriers):
    calls = []
    times = repeats.timed_repeats(arms_that_log(calls, clock, {"a": 1.0, "b": 10.0}), repeats=3, steps=2)
    block_a, block_b = [("a", 0), ("a", 1)], [("b", 0), ("b", 1)]
    assert calls == block_a + block_b + block_b + block_a + block_a + block_b
    assert times == {"a": [[1.0, 2.0]] * 3, "b": [[10.0, 20.0]] * 3}
    assert len(barriers) == 3 * 2  # one per arm and repeat


def test_step_by_step_interleaving_alternates_every_step_with_a_barrier_each(clock, barriers):
    calls = []
    times = repeats.timed_repeats(
        arms_that_log(calls, clock, {"a": 1.0, "b": 10.0}), repeats=2, steps=2, interleave="step"
    )
    assert calls == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("b", 0), ("a", 0), ("a", 1), ("b", 1)]
    assert times == {"a": [[1.0, 2.0]] * 2, "b": [[10.0, 20.0]] * 2}
    assert len(barriers) == 2 * 2 * 2  # one per arm, step and repeat
    assert repeats.repeat_totals(times["b"]) == [30.0, 30.0]


def test_the_last_step_of_a_block_includes_the_device_sync(clock, barriers, monkeypatch):
    synced = []

    def sync(device):
        synced.append(device)
        clock.now += 0.5  # work the block queued, finished only at the sync

    monkeypatch.setattr(repeats, "sync", sync)
    times = repeats.timed_repeats(arms_that_log([], clock, {"a": 1.0}), repeats=1, steps=3, device="dev")
    assert times == {"a": [[1.0, 2.0, 3.5]]} and synced == ["dev", "dev"]  # before the block, after it


def test_the_slowest_rank_sets_each_repeats_time(monkeypatch):
    monkeypatch.setattr(repeats.dist, "all_gather_object", lambda mine: [[1.0, 5.0, 2.0], mine])
    assert repeats.slowest_rank([3.0, 4.0, 2.0]) == [3.0, 5.0, 2.0]


def test_an_unknown_interleave_is_refused_before_any_step():
    with pytest.raises(ValueError, match="interleave = 'arm'"):
        repeats.timed_repeats({"a": lambda i: pytest.fail("ran")}, repeats=1, steps=1, interleave="arm")
