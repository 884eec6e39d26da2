"""Shard geometry and per-epoch order (pure Python)."""

import time
import tracemalloc

import pytest
from hypothesis import given, settings, strategies as st

from antdt_tf.errors import InvalidRequest
from antdt_tf.sharding.plan import DataFile, DatasetSpec, Permutation, ShardPlan


def test_num_records_geometry_covers_every_record_once():
    plan = ShardPlan(DatasetSpec("d", records_per_shard=10, num_records=95))
    assert plan.num_shards == 10 and plan.num_records == 95
    ranges = [(g.start, g.length) for g in map(plan.geometry, range(plan.num_shards))]
    assert ranges[-1] == (90, 5)
    assert sum(length for _, length in ranges) == 95
    assert all(a + la == b for (a, la), (b, _) in zip(ranges, ranges[1:]))


def test_files_geometry_never_crosses_a_file():
    spec = DatasetSpec("d", records_per_shard=4,
                       files=(DataFile("a", 10), DataFile("empty", 0), DataFile("b", 3)))
    plan = ShardPlan(spec)
    got = [(g.file, g.file_start, g.length, g.start) for g in map(plan.geometry, range(plan.num_shards))]
    assert got == [("a", 0, 4, 0), ("a", 4, 4, 4), ("a", 8, 2, 8), ("b", 0, 3, 10)]


@pytest.mark.parametrize("kwargs,match", [
    (dict(name="d", records_per_shard=0, num_records=10), "records_per_shard"),
    (dict(name="d", records_per_shard=-1, num_records=10), "records_per_shard"),
    (dict(name="d", records_per_shard=1, num_records=0), "num_records"),
    (dict(name="d", records_per_shard=1, num_records=-5), "num_records"),
    (dict(name="d", records_per_shard=1, num_records=5, num_epochs=0), "num_epochs"),
    (dict(name="", records_per_shard=1, num_records=5), "name"),
    (dict(name="bad name", records_per_shard=1, num_records=5), "name"),
    (dict(name="d", records_per_shard=1, num_records=5, files=(DataFile("a", 1),)), "not both"),
    (dict(name="d", records_per_shard=1, files=(DataFile("a", -1),)), "negative"),
    (dict(name="d", records_per_shard=1, files=(DataFile("", 3),)), "empty path"),
    (dict(name="d", records_per_shard=1, files=(DataFile("a", 0),)), "no records"),
])
def test_bad_specs_are_rejected_with_the_reason(kwargs, match):
    with pytest.raises(InvalidRequest, match=match):
        DatasetSpec(**kwargs)


@given(n=st.integers(1, 3000), seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 50))
@settings(deadline=None)
def test_permutation_is_a_bijection_with_an_inverse(n, seed, epoch):
    perm = Permutation(n, seed, epoch)
    image = [perm(i) for i in range(n)]
    assert sorted(image) == list(range(n))
    assert all(perm.inverse(v) == i for i, v in enumerate(image))


def test_order_is_deterministic_and_differs_between_epochs():
    spec = DatasetSpec("d", records_per_shard=1, num_records=1000, shuffle=True, seed=7)
    a, b = ShardPlan(spec), ShardPlan(spec)
    first = [a.order(0)(i) for i in range(1000)]
    assert first == [b.order(0)(i) for i in range(1000)]
    assert first != [a.order(1)(i) for i in range(1000)]
    assert first != list(range(1000))
    # Pinned values: a restarted master must recompute the order a cursor points into,
    # so the permutation may never change between releases.
    assert first[:5] == [314, 744, 686, 355, 256]


def _plan_and_sample(num_shards: int, positions) -> set:
    """A shuffled plan of ``num_shards`` shards and the ids at ``positions`` of an epoch."""
    plan = ShardPlan(DatasetSpec("big", records_per_shard=1000, num_records=num_shards * 1000,
                                 shuffle=True))
    assert plan.num_shards == num_shards
    order = plan.order(3)
    return {order(i) for i in positions}


def test_plan_of_a_million_shards_is_small_and_fast():
    """O(1) in the number of shards: a plan of 10^6 shards and 1003 lookups in its order
    cost what a plan of 10^3 shards and as many lookups cost (a list of the shards, or
    of the order, would make it >= 100x dearer) — timed against that baseline in the
    same run, so a loaded machine slows both; the smallest of interleaved repetitions
    drops the moments another process ran. Memory is counted by tracemalloc (this
    process's high-water mark would hide an allocation below an earlier peak)."""
    big = range(0, 10**6, 997)
    small = [i % 1000 for i in big]            # as many lookups in a 1000-shard order
    assert len(_plan_and_sample(10**6, big)) == len(big)
    timings = {10**6: [], 1000: []}
    for _ in range(7):
        for n, positions in ((10**6, big), (1000, small)):
            t0 = time.perf_counter()
            _plan_and_sample(n, positions)
            timings[n].append(time.perf_counter() - t0)
    fast, baseline = min(timings[10**6]), min(timings[1000])
    assert fast < 4 * baseline, timings
    tracemalloc.start()
    try:
        _plan_and_sample(10**6, big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak        # the 1003 sampled ids and the plan: ~70 kB
