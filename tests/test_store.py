"""StateStore: snapshot + journal on real files; replay equals the live state."""

import os

import pytest

from antdt_tf.errors import CorruptState, IncompatibleState, StateDirLocked
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.plan import DatasetSpec
from antdt_tf.sharding.state import LeaseConfig, ShardState
from antdt_tf.sharding.store import StateStore, open_state

DONE, PROGRESS = pb.ReportShardRequest.DONE, pb.ReportShardRequest.PROGRESS


def W(i, inc=0):
    return pb.TaskId(type="worker", index=i, incarnation=inc)


def fresh(tmp_path, **store_kwargs):
    store = StateStore(tmp_path / "state", **store_kwargs)
    state = ShardState(LeaseConfig())
    open_state(store, state)
    return state, store


def work(state, n, task=W(0), dataset="train"):
    shards = []
    for _ in range(n):
        s = state.get_shard(dataset, task).shard
        state.report_shard(pb.ReportShardRequest(
            dataset=dataset, task=task, lease_id=s.lease_id, shard_id=s.shard_id, epoch=s.epoch,
            outcome=DONE, records_processed=s.length))
        shards.append(s)
    return shards


def comparable(state):
    snap = state.snapshot()
    return snap.SerializeToString(deterministic=True)


def simulate_kill(store):
    """kill -9: descriptors gone without close() (the journal is in the page cache)."""
    store._journal_fd and os.close(store._journal_fd)
    store._journal_fd = None
    os.close(store._lock_fd)
    store._lock_fd = None


def reopen(tmp_path, store):
    store.close()
    state2 = ShardState(LeaseConfig())
    store2 = StateStore(tmp_path / "state")
    info = open_state(store2, state2)
    return state2, store2, info


@pytest.mark.parametrize("snapshot_every", [1, 7, 100_000])
def test_reopen_restores_exactly_the_acknowledged_state(tmp_path, snapshot_every):
    state, store = fresh(tmp_path, snapshot_every=snapshot_every)
    state.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=1000, shuffle=True))
    work(state, 20)
    held = state.get_shard("train", W(1)).shard
    state.report_shard(pb.ReportShardRequest(dataset="train", task=W(1), lease_id=held.lease_id,
                                             shard_id=held.shard_id, outcome=PROGRESS,
                                             records_processed=4))
    if store.needs_snapshot:
        store.write_snapshot(state.snapshot())
    before = comparable(state)
    simulate_kill(store)
    state2, store2, info = reopen(tmp_path, store)
    assert comparable(state2) == before
    # the holder keeps its lease across the restart and finishes it
    resp = state2.report_shard(pb.ReportShardRequest(
        dataset="train", task=W(1), lease_id=held.lease_id, shard_id=held.shard_id,
        outcome=DONE, records_processed=held.length))
    assert resp.result == pb.ReportShardResponse.ACCEPTED
    nxt = work(state2, 1)[0]
    assert nxt.lease_id > held.lease_id
    store2.close()


def test_torn_last_record_is_dropped_and_the_rest_replayed(tmp_path):
    state, store = fresh(tmp_path)
    state.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=100))
    work(state, 3)
    journal = tmp_path / "state" / f"journal.{store.generation}.log"
    store.close()
    size = journal.stat().st_size
    with open(journal, "r+b") as f:
        f.truncate(size - 3)   # a crash in the middle of the last write
    state2, store2, info = reopen(tmp_path, StateStore(tmp_path / "unused"))
    assert state2.progress("train").datasets[0].done_shards == 2  # last DONE was never acked
    assert state2.progress("train").datasets[0].doing_shards == 1
    store2.close()


@pytest.mark.parametrize("damage,match", [
    (lambda d: (d / "snapshot.pb").write_bytes(b"garbage"), "bad magic"),
    (lambda d: _flip_byte(d / "snapshot.pb", -2), "checksum"),
    (lambda d: _flip_byte(next(d.glob("journal.*.log")), 40), "checksum mismatch"),
    (lambda d: (d / "snapshot.pb").unlink(), "no snapshot"),
])
def test_damaged_state_refuses_to_load_and_is_left_untouched(tmp_path, damage, match):
    state, store = fresh(tmp_path)
    state.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=100))
    work(state, 3)
    store.close()
    d = tmp_path / "state"
    damage(d)
    files = {p.name: p.read_bytes() for p in d.iterdir() if p.name != "LOCK"}
    with pytest.raises(CorruptState, match=match):
        open_state(StateStore(d), ShardState())
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.name != "LOCK"} == files


def test_discard_corrupt_moves_the_damage_aside_and_starts_fresh(tmp_path):
    state, store = fresh(tmp_path)
    state.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=100))
    store.close()
    d = tmp_path / "state"
    _flip_byte(d / "snapshot.pb", -2)
    damaged = (d / "snapshot.pb").read_bytes()
    state2, store2 = ShardState(), StateStore(d)
    open_state(store2, state2, discard_corrupt=True)
    assert state2.datasets == []
    (aside,) = d.glob("corrupt-*")
    assert (aside / "snapshot.pb").read_bytes() == damaged
    store2.close()


def test_unknown_format_version_is_incompatible(tmp_path):
    state, store = fresh(tmp_path)
    bad = state.snapshot()
    bad.format_version = 9
    store.write_snapshot(bad)
    store.close()
    with pytest.raises(IncompatibleState, match="format version 9"):
        open_state(StateStore(tmp_path / "state"), ShardState())


def test_journal_entry_that_does_not_apply_is_corruption(tmp_path):
    state, store = fresh(tmp_path)
    store.append(pb.JournalEntry(time=1, settle=pb.SettleEvent(dataset="nope", lease_id=5)))
    store.close()
    with pytest.raises(CorruptState, match="does not apply"):
        open_state(StateStore(tmp_path / "state"), ShardState())


def test_second_master_on_the_same_dir_is_refused(tmp_path):
    _, store = fresh(tmp_path)
    with pytest.raises(StateDirLocked):
        open_state(StateStore(tmp_path / "state"), ShardState())
    store.close()


def test_compaction_keeps_one_journal_generation(tmp_path):
    state, store = fresh(tmp_path, snapshot_every=5)
    state.register_dataset(DatasetSpec("train", records_per_shard=1, num_records=100))
    for _ in range(10):
        work(state, 1)
        if store.needs_snapshot:
            store.write_snapshot(state.snapshot())
    journals = list((tmp_path / "state").glob("journal.*.log"))
    assert len(journals) == 1 and store.generation > 2
    state2, store2, _ = reopen(tmp_path, store)
    assert state2.progress("train").datasets[0].done_shards == 10
    store2.close()


def _flip_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("snapshot_every", [1, 100_000])
def test_after_restart_a_silent_holders_shard_is_reissued_after_one_lease_term(
        tmp_path, snapshot_every):
    now = [1000.0]
    clock = lambda: now[0]  # noqa: E731
    cfg = LeaseConfig(min_seconds=1, initial_seconds=60)
    state, store = ShardState(cfg, clock=clock), StateStore(tmp_path / "s",
                                                            snapshot_every=snapshot_every)
    open_state(store, state)
    state.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=100))
    for _ in range(3):                                  # learn the speed: 0.1 s/record
        s = state.get_shard("train", W(0)).shard
        now[0] += 1.0
        state.report_shard(pb.ReportShardRequest(dataset="train", task=W(0), lease_id=s.lease_id,
                                                 shard_id=s.shard_id, outcome=DONE,
                                                 records_processed=s.length))
        if store.needs_snapshot:
            store.write_snapshot(state.snapshot())
    held = state.get_shard("train", W(1)).shard          # then W(1) dies with the master
    assert held.lease_seconds == pytest.approx(4 * 0.1 * 10)
    store.close()
    state2 = ShardState(cfg, clock=clock)
    open_state(StateStore(tmp_path / "s"), state2)
    now[0] += 1.0
    assert state2.expire_leases() == 0                  # a grace term: W(1) may still report
    now[0] += held.lease_seconds
    assert state2.expire_leases() == 1                  # W(1) never came back
    again = state2.get_shard("train", W(0)).shard
    assert (again.shard_id, again.start, again.length) == (held.shard_id, held.start, held.length)


@pytest.mark.parametrize("snapshot_every", [3, 100_000])
def test_static_sharding_replays_exactly(tmp_path, snapshot_every):
    state, store = fresh(tmp_path, snapshot_every=snapshot_every)
    state.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=300,
                                       shuffle=True, static_workers=2))
    work(state, 5, task=W(0))
    work(state, 2, task=W(1))
    held = state.get_shard("train", W(1)).shard
    state.report_task_failure(W(1))              # its remainder goes back, first for worker 1
    if store.needs_snapshot:
        store.write_snapshot(state.snapshot())
    before = comparable(state)
    simulate_kill(store)
    state2, store2, _ = reopen(tmp_path, store)
    assert comparable(state2) == before
    again = state2.get_shard("train", W(1, inc=1)).shard
    assert (again.shard_id, again.start) == (held.shard_id, held.start)
    store2.close()


@pytest.mark.parametrize("option,counter,offset", [
    ("tail_stealing", "stolen_leases", 30),    # the rest after the batch in flight
    ("backup_leases", "backup_leases", 20),    # a duplicate from the last report on
])
def test_a_steal_or_a_backup_lease_replays_exactly(tmp_path, option, counter, offset):
    state, store = fresh(tmp_path)
    state.register_dataset(DatasetSpec("train", records_per_shard=100, num_records=300,
                                       **{option: True}))
    slow, fast = W(0), W(1)
    work(state, 1, task=fast)
    held = state.get_shard("train", slow).shard
    work(state, 1, task=fast)
    for k in (10, 20):
        state.report_shard(pb.ReportShardRequest(
            dataset="train", task=slow, lease_id=held.lease_id, shard_id=held.shard_id,
            outcome=PROGRESS, records_processed=k))
    # make the slow worker look slow: its lease was issued long ago (its pace on it)
    state._runs["train"].doing[held.lease_id].issued_at -= 100.0
    state._tasks["worker:1"].seconds_per_record = 0.01
    rest = state.get_shard("train", fast).shard
    assert (rest.shard_id, rest.start) == (held.shard_id, held.start + offset)
    # (the poked times above are not journaled: compare the datasets, not the tasks)
    datasets = lambda st: st.snapshot(with_tasks=False).SerializeToString(  # noqa: E731
        deterministic=True)
    before = datasets(state)
    simulate_kill(store)
    state2, store2, _ = reopen(tmp_path, store)
    assert datasets(state2) == before
    assert getattr(state2.progress("train").datasets[0], counter) == 1
    store2.close()
