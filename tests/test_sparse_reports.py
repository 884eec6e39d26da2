"""Sparse reports: leases reported per lease and closure, settled from the PS record.

The master's side (pure Python, ``ShardState``): which leases may be reported sparsely,
how a dead or silent holder's sparse leases are held instead of going back to TODO from
the master's (older) count, and how the trainer's record settles them. The TF side
(the record written in the step, the chief settling) runs in test_pss_training's
worker-SIGKILL test and test_tf_rpc.
"""

import pytest

from antdt_tf.errors import InvalidRequest, LeaseNotHeld
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.plan import DatasetSpec
from antdt_tf.sharding.state import LeaseConfig, ShardState

from state_helpers import Clock, W, progress

SHARD = pb.GetShardResponse.SHARD
PROGRESS, DONE = pb.ReportShardRequest.PROGRESS, pb.ReportShardRequest.DONE


def make(records=100, rps=10, journal=None, **spec):
    clock = Clock()
    state = ShardState(LeaseConfig(min_seconds=30, initial_seconds=60, settle_seconds=5),
                       journal=journal, clock=clock)
    state.register_dataset(DatasetSpec("train", records_per_shard=rps, num_records=records,
                                       seed=1, **spec))
    return state, clock


def lease(state, task, sparse_ok=True):
    r = state.get_shard("train", task, sparse_ok=sparse_ok)
    assert r.status == SHARD
    return r.shard


def report(state, shard, task, records, outcome=PROGRESS):
    return state.report_shard(pb.ReportShardRequest(
        dataset="train", task=task, lease_id=shard.lease_id, shard_id=shard.shard_id,
        epoch=shard.epoch, outcome=outcome, records_processed=records))


def test_a_dead_holders_sparse_lease_is_held_until_the_record_settles_it():
    state, _ = make()
    a = lease(state, W(0))
    assert a.sparse_reports
    report(state, a, W(0), 3)                    # its last closure-end report
    assert state.report_task_failure(W(0)) == 1
    p = progress(state)
    assert [(h.lease_id, h.holder.index, h.applied) for h in p.held] == [(a.lease_id, 0, 3)]
    # held: not re-issued from the master's (older) count while the record is pending
    b = lease(state, W(1))
    assert b.shard_id != a.shard_id
    # the trainer read 7 applied records from the PS: the rest goes back from there
    assert state.apply_record("train", a.lease_id, W(0), 7)
    assert not progress(state).held
    assert progress(state).records_done_total == 7
    c = lease(state, W(1))
    assert (c.shard_id, c.start, c.length) == (a.shard_id, a.start + 7, 3)
    # a repeated or late record changes nothing
    assert not state.apply_record("train", a.lease_id, W(0), 9)
    assert progress(state).records_done_total == 7


def test_a_held_lease_without_a_record_goes_back_from_the_masters_count_after_the_timeout():
    state, clock = make()
    a = lease(state, W(0))
    report(state, a, W(0), 4)
    state.get_shard("train", W(0, 1), sparse_ok=True)   # a new incarnation: the old is gone
    assert [h.holder.incarnation for h in progress(state).held] == [0]
    clock.now += 4
    assert state.expire_leases() == 0 and progress(state).held
    clock.now += 2                                       # settle_seconds (5) passed
    assert state.expire_leases() == 1
    assert not progress(state).held
    again = lease(state, W(1))
    assert (again.shard_id, again.start) == (a.shard_id, a.start + 4)


def test_a_held_lease_is_kept_while_the_trainer_says_it_is_alive():
    """The trainer's keeper thread renews the settle timeout (KeepHeldLeases): a main
    thread stuck in a long join does not let the master re-issue the dead worker's lease
    from its older count; once the keeper stops, the lease expires a timeout later."""
    state, clock = make()
    a = lease(state, W(0))
    report(state, a, W(0), 4)
    state.report_task_failure(W(0))
    for _ in range(6):                                   # 6 x 4 s > settle_seconds (5)
        clock.now += 4
        assert state.keep_held("train") == 1
        assert state.expire_leases() == 0
    assert [h.lease_id for h in progress(state).held] == [a.lease_id]
    assert state.apply_record("train", a.lease_id, W(0), 9)   # the late settle still counts
    assert progress(state).records_done_total == 9
    assert state.keep_held("train") == 0
    b = lease(state, W(1))
    report(state, b, W(1), 1)
    state.report_task_failure(W(1))
    clock.now += 4
    state.keep_held("train")
    clock.now += 4                                       # no keep since: 4 s < 5 s
    assert state.expire_leases() == 0
    clock.now += 2
    assert state.expire_leases() == 1 and not progress(state).held


def test_a_record_of_minus_one_settles_at_the_masters_count():
    state, _ = make()
    a = lease(state, W(0))
    report(state, a, W(0), 2)
    state.report_task_failure(W(0))
    assert state.apply_record("train", a.lease_id, W(0), -1)
    again = lease(state, W(1))
    assert (again.shard_id, again.start) == (a.shard_id, a.start + 2)


def test_a_silent_holders_sparse_lease_expires_into_held_and_its_late_report_settles_it():
    state, clock = make()
    a = lease(state, W(0))
    clock.now += 61                                      # initial_seconds: no pace known yet
    state.expire_leases()
    assert [h.lease_id for h in progress(state).held] == [a.lease_id]
    # the holder was only stopped; its next (closure-end) report says how far it got:
    # that settles the lease, and the report is refused (the rest is not its own now)
    with pytest.raises(LeaseNotHeld, match="expired while it was silent"):
        report(state, a, W(0), 6)
    assert not progress(state).held and progress(state).records_done_total == 6
    again = lease(state, W(1))
    assert (again.shard_id, again.start) == (a.shard_id, a.start + 6)


def test_a_record_counts_a_live_lease_up_to_where_its_holder_got():
    state, _ = make()
    a = lease(state, W(0))
    assert state.apply_record("train", a.lease_id, W(0), 5)       # PROGRESS
    assert progress(state).records_done_total == 5
    assert state.apply_record("train", a.lease_id, W(0), 4)       # behind: nothing to do
    assert progress(state).records_done_total == 5
    report(state, a, W(0), 8)                                     # the holder goes on
    assert state.apply_record("train", a.lease_id, W(0), 10)      # DONE
    assert progress(state).done_shards == 1 and progress(state).records_done_total == 10
    b = lease(state, W(0))
    assert not state.apply_record("train", b.lease_id, W(1), 3)   # not that holder's
    assert not state.apply_record("train", b.lease_id, W(0, 5), 3)
    with pytest.raises(InvalidRequest, match="outside"):
        state.apply_record("train", b.lease_id, W(0), 11)
    assert progress(state).records_done_total == 10


def test_leases_that_may_be_stolen_are_still_reported_per_batch():
    # without stealing or backups: every lease of a sparse-capable trainer is sparse
    state, _ = make()
    assert all(lease(state, W(i % 2)).sparse_reports for i in range(10))
    # a trainer without a PS record: never
    state, _ = make()
    assert not lease(state, W(0), sparse_ok=False).sparse_reports
    # tail stealing: a holder's leases before its pace is known (its first), and the
    # tail of the epoch (<= 2 shards per live worker left) are dense
    state, clock = make(tail_stealing=True)
    first = [lease(state, W(i)) for i in range(2)]
    assert [s.sparse_reports for s in first] == [False, False]
    clock.now += 1
    for i, s in enumerate(first):
        report(state, s, W(i), s.length, DONE)
    flags = [lease(state, W(i % 2)).sparse_reports for i in range(8)]
    assert flags == [True] * 4 + [False] * 4


@pytest.mark.parametrize("seconds, sparse", [
    (4, False),      # a slow holder: dense leases, so that they can be stolen
    (1.3, True),     # within the noise of the pace (not slow by the Monitor's 1.5x either)
])
def test_a_slow_holder_gets_dense_leases_one_within_the_noise_sparse(seconds, sparse):
    state, clock = make(records=400, tail_stealing=True)
    for _ in range(6):                       # worker 0: 1 s per shard
        a = lease(state, W(0))
        clock.now += 1
        report(state, a, W(0), a.length, DONE)
    b = lease(state, W(1))                   # worker 1: `seconds` per shard
    clock.now += seconds
    report(state, b, W(1), b.length, DONE)
    assert lease(state, W(0)).sparse_reports
    assert lease(state, W(1)).sparse_reports is sparse


def test_held_leases_survive_journal_replay_snapshot_load_and_restore():
    journal = []
    state, _ = make(journal=journal.append)
    a = lease(state, W(0))
    report(state, a, W(0), 3)
    state.report_task_failure(W(0))
    lease(state, W(1))
    replayed = ShardState(LeaseConfig(min_seconds=30, initial_seconds=60, settle_seconds=5))
    for entry in journal:
        replayed.apply(entry)
    for other in (replayed, ShardState()):
        if other is not replayed:
            other.load(state.snapshot())
        held = progress(other).held
        assert [(h.lease_id, h.applied) for h in held] == [(a.lease_id, 3)]
        assert other.apply_record("train", a.lease_id, W(0), 6)
        assert progress(other).records_done_total == 6
    # a checkpoint restore gives every lease back, held ones too, from the master's count
    state.restore_state(state.snapshot(for_checkpoint=True))
    assert not progress(state).held
    starts = {}
    while (r := state.get_shard("train", W(1, 1))).status == SHARD:
        starts.setdefault(r.shard.shard_id, r.shard.start)
    assert starts[a.shard_id] == a.start + 3
