"""ShardState semantics: leases, exactly-once accounting, failures, epochs, snapshots."""

import random

import pytest
from hypothesis import given, settings, strategies as st

from antdt_tf.errors import (CorruptState, DatasetConflict, IncompatibleState, InvalidRequest,
                             LeaseNotHeld, StaleIncarnation, UnknownDataset, UnknownTask)
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.plan import DatasetSpec
from antdt_tf.sharding.state import LeaseConfig, ShardState

from state_helpers import Clock, W, progress

SHARD, WAIT, END = pb.GetShardResponse.SHARD, pb.GetShardResponse.WAIT, pb.GetShardResponse.END
DONE, FAILED, PROGRESS = (pb.ReportShardRequest.DONE, pb.ReportShardRequest.FAILED,
                          pb.ReportShardRequest.PROGRESS)


def report(state, shard, task, outcome=DONE, records=None, get_next=False):
    records = shard.length if records is None else records
    return state.report_shard(pb.ReportShardRequest(
        dataset=shard.dataset, task=task, lease_id=shard.lease_id, shard_id=shard.shard_id,
        epoch=shard.epoch, outcome=outcome, records_processed=records, get_next=get_next))


def make(records=100, rps=10, epochs=1, shuffle=False, **cfg):
    clock = Clock()
    state = ShardState(LeaseConfig(**cfg), clock=clock)
    state.register_dataset(DatasetSpec("train", records_per_shard=rps, num_records=records,
                                       num_epochs=epochs, shuffle=shuffle, seed=1))
    return state, clock


def drain(state, task, dataset="train"):
    """Trains everything available to ``task``; returns the (start, length) ranges."""
    ranges = []
    while True:
        r = state.get_shard(dataset, task)
        if r.status != SHARD:
            return ranges, r.status
        ranges.append((r.shard.start, r.shard.length))
        report(state, r.shard, task)


def test_one_worker_trains_everything_once_then_end():
    state, _ = make(records=95, rps=10, shuffle=True)
    ranges, status = drain(state, W(0))
    assert status == END
    assert sorted(ranges) == [(i, 10) for i in range(0, 90, 10)] + [(90, 5)]
    p = progress(state)
    assert p.finished and p.done_shards == 10 and p.records_done_epoch == 95
    assert state.get_shard("train", W(0)).status == END


def test_register_is_idempotent_and_conflicts_are_errors():
    state, _ = make()
    assert state.register_dataset(DatasetSpec("train", records_per_shard=10, num_records=100,
                                              seed=1)) == (False, 10, 100)
    with pytest.raises(DatasetConflict, match="records_per_shard: registered 10, now 20"):
        state.register_dataset(DatasetSpec("train", records_per_shard=20, num_records=100, seed=1))


def test_wait_is_not_end_while_shards_are_leased():
    state, _ = make(records=20, rps=10)
    a = state.get_shard("train", W(0)).shard
    b = state.get_shard("train", W(0)).shard
    resp = state.get_shard("train", W(1))
    assert resp.status == WAIT and resp.retry_after_seconds > 0
    report(state, a, W(0))
    assert state.get_shard("train", W(1)).status == WAIT
    report(state, b, W(0))
    assert state.get_shard("train", W(1)).status == END


def test_duplicate_done_is_idempotent_and_counts_once():
    state, _ = make()
    s = state.get_shard("train", W(0)).shard
    assert report(state, s, W(0)).result == pb.ReportShardResponse.ACCEPTED
    assert report(state, s, W(0)).result == pb.ReportShardResponse.DUPLICATE
    assert progress(state).records_done_epoch == 10


def test_done_from_a_lease_taken_away_is_refused_and_not_counted():
    state, _ = make()
    s = state.get_shard("train", W(0)).shard
    assert state.report_task_failure(W(0)) == 1            # declared dead
    with pytest.raises(StaleIncarnation, match="declared dead"):
        report(state, s, W(0))
    again = state.get_shard("train", W(1)).shard           # re-issued to another worker
    assert again.shard_id == s.shard_id and again.lease_id != s.lease_id
    state.get_shard("train", W(0, incarnation=1))          # the relaunched worker
    with pytest.raises(LeaseNotHeld, match="not counted"):
        report(state, again, W(0, incarnation=1))
    with pytest.raises(StaleIncarnation, match="replaced"):
        report(state, s, W(0))
    assert progress(state).records_done_epoch == 0
    report(state, again, W(1))
    assert progress(state).records_done_epoch == 10


def test_failed_task_shards_go_back_first_from_their_applied_offset():
    state, _ = make(records=100, rps=10)
    held = state.get_shard("train", W(0)).shard
    report(state, held, W(0), PROGRESS, records=4)
    state.get_shard("train", W(1))
    assert state.report_task_failure(W(0), ) == 1
    nxt = state.get_shard("train", W(2)).shard
    assert (nxt.shard_id, nxt.start, nxt.length) == (held.shard_id, held.start + 4, 6)
    assert nxt.attempt == 1 and nxt.shard_length == 10
    assert progress(state).records_done_epoch == 4
    report(state, nxt, W(2))
    assert progress(state).records_done_epoch == 10


def test_late_failure_report_of_a_replaced_incarnation_changes_nothing():
    state, _ = make()
    state.get_shard("train", W(0))
    state.get_shard("train", W(0, incarnation=1))   # relaunch released the old lease
    held = state.get_shard("train", W(0, incarnation=1)).shard
    assert state.report_task_failure(W(0, incarnation=0)) == 0
    report(state, held, W(0, incarnation=1))


def test_lease_expiry_uses_observed_speed_so_slow_workers_keep_their_shards():
    state, clock = make(records=1000, rps=10, min_seconds=0.1, initial_seconds=100,
                        factor=3)
    # fast worker: 0.01 s/record; slow worker: 0.04 s/record (4x)
    for _ in range(3):
        s = state.get_shard("train", W(0)).shard
        clock.now += 0.1
        report(state, s, W(0))
        s = state.get_shard("train", W(1)).shard
        clock.now += 0.4
        report(state, s, W(1))
    slow = state.get_shard("train", W(1)).shard
    fast = state.get_shard("train", W(0)).shard
    assert slow.lease_seconds == pytest.approx(3 * 0.04 * 10, rel=0.01)
    assert fast.lease_seconds < slow.lease_seconds
    clock.now += 0.4 * 2.5   # both silent for 2.5x the slow worker's own shard time
    assert state.expire_leases() == 1            # only the fast worker's lease is overdue
    report(state, slow, W(1))                    # the slow worker keeps its shard
    with pytest.raises(LeaseNotHeld):
        report(state, fast, W(0))


def test_progress_renews_the_lease():
    state, clock = make(min_seconds=5, initial_seconds=10)
    s = state.get_shard("train", W(0)).shard
    clock.now += 8
    report(state, s, W(0), PROGRESS, records=5)
    clock.now += 8
    assert state.expire_leases() == 0
    report(state, s, W(0))


def test_shard_failing_too_often_is_poisoned_and_the_job_goes_on():
    state, _ = make(records=30, rps=10, max_failures=2)
    s = state.get_shard("train", W(0)).shard
    report(state, s, W(0), FAILED, records=0)
    s2 = state.get_shard("train", W(0)).shard
    assert s2.shard_id == s.shard_id and s2.attempt == 1
    report(state, s2, W(0), FAILED, records=3)
    ranges, status = drain(state, W(1))
    assert status == END and len(ranges) == 2
    p = progress(state)
    assert p.finished and p.poisoned_shards == 1 and list(p.poisoned_shard_ids) == [s.shard_id]
    assert p.records_done_epoch == 23


def test_epochs_advance_only_when_every_shard_is_done_and_reshuffle():
    state, _ = make(records=50, rps=10, epochs=2, shuffle=True)
    orders = []
    for epoch in range(2):
        shards = [state.get_shard("train", W(0)).shard for _ in range(5)]
        assert {s.epoch for s in shards} == {epoch}
        orders.append([s.shard_id for s in shards])
        for s in shards[:-1]:
            report(state, s, W(0))
        assert state.get_shard("train", W(1)).status == WAIT
        report(state, shards[-1], W(0))
    assert sorted(orders[0]) == sorted(orders[1]) == list(range(5))
    assert orders[0] != orders[1]
    assert state.get_shard("train", W(0)).status == END
    assert progress(state).records_done_total == 100


def test_multiple_datasets_are_independent():
    state, _ = make(records=20, rps=10)
    state.register_dataset(DatasetSpec("eval", records_per_shard=5, num_records=10))
    assert len(drain(state, W(0), "eval")[0]) == 2
    assert progress(state, "train").done_shards == 0
    assert progress(state, "eval").finished


def test_request_id_makes_a_retried_get_shard_return_the_same_lease():
    state, _ = make()
    a = state.get_shard("train", W(0), request_id=77).shard
    b = state.get_shard("train", W(0), request_id=77).shard
    c = state.get_shard("train", W(0), request_id=78).shard
    assert a == b and c.lease_id != a.lease_id


@pytest.mark.parametrize("mutate,error,match", [
    (lambda r: setattr(r, "dataset", "nope"), UnknownDataset, "unknown dataset"),
    (lambda r: r.task.CopyFrom(W(9)), UnknownTask, "never asked"),
    (lambda r: r.task.CopyFrom(W(0, incarnation=5)), UnknownTask, "never asked"),
    (lambda r: setattr(r.task, "type", "Bad Type"), InvalidRequest, "task type"),
    (lambda r: setattr(r.task, "index", -1), InvalidRequest, "index"),
    (lambda r: setattr(r, "records_processed", 11), InvalidRequest, "exceeds"),
    (lambda r: setattr(r, "records_processed", 9), InvalidRequest, "DONE must report all"),
    (lambda r: setattr(r, "records_processed", -1), InvalidRequest, ">= 0"),
    (lambda r: setattr(r, "outcome", 0), InvalidRequest, "outcome"),
    (lambda r: setattr(r, "shard_id", 99), InvalidRequest, "report names shard"),
    (lambda r: setattr(r, "lease_id", 12345), LeaseNotHeld, "not held"),
])
def test_bad_reports_get_a_specific_error_and_change_nothing(mutate, error, match):
    state, _ = make()
    s = state.get_shard("train", W(0)).shard
    before = state.snapshot().SerializeToString()
    req = pb.ReportShardRequest(dataset="train", task=W(0), lease_id=s.lease_id,
                                shard_id=s.shard_id, epoch=s.epoch, outcome=DONE,
                                records_processed=s.length)
    mutate(req)
    with pytest.raises(error, match=match):
        state.report_shard(req)
    assert state.snapshot().SerializeToString() == before


def test_progress_going_backwards_is_rejected():
    state, _ = make()
    s = state.get_shard("train", W(0)).shard
    report(state, s, W(0), PROGRESS, records=6)
    with pytest.raises(InvalidRequest, match="never goes back"):
        report(state, s, W(0), FAILED, records=5)


def test_save_restore_turns_doing_into_todo_and_revokes_current_leases():
    state, _ = make(records=100, rps=10, shuffle=True)
    done = [state.get_shard("train", W(0)).shard for _ in range(3)]
    for s in done:
        report(state, s, W(0))
    doing = state.get_shard("train", W(1)).shard
    report(state, doing, W(1), PROGRESS, records=3)
    saved = state.snapshot(["train"], with_tasks=False)
    after = [state.get_shard("train", W(0)).shard for _ in range(2)]   # trained after the checkpoint
    for s in after:
        report(state, s, W(0))
    names, requeued = state.restore_state(saved)
    assert names == ["train"] and requeued == 1
    with pytest.raises(LeaseNotHeld):
        report(state, doing, W(1))
    p = progress(state)
    assert p.done_shards == 3 and p.todo_shards == 7 and p.records_done_epoch == 33
    first = state.get_shard("train", W(2)).shard
    assert (first.shard_id, first.start) == (doing.shard_id, doing.start + 3)
    report(state, first, W(2))
    rest, status = drain(state, W(2))
    assert status == END
    trained = [(s.start, s.length) for s in done] + [(doing.start, 3), (first.start, first.length)]
    covered = sorted(r for start, n in trained + rest for r in range(start, start + n))
    assert covered == list(range(100))
    assert progress(state).records_done_epoch == 100


@pytest.mark.parametrize("mutate,error,match", [
    (lambda st: setattr(st, "format_version", 2), IncompatibleState, "version 2"),
    (lambda st: setattr(st.datasets[0], "cursor", 11), InvalidRequest, "cursor"),
    (lambda st: st.datasets[0].requeued.add(shard_id=10), InvalidRequest, "out of range"),
    (lambda st: st.datasets[0].requeued.add(shard_id=0, offset=10), InvalidRequest, "offset"),
    (lambda st: st.datasets[0].requeued.add(shard_id=0).__class__ and
     st.datasets[0].poisoned.add(shard_id=0), InvalidRequest, "twice"),
    (lambda st: setattr(st.datasets[0].spec, "seed", 99), IncompatibleState,
     "different parameters"),
])
def test_restore_rejects_bad_snapshots_without_changing_state(mutate, error, match):
    state, _ = make(records=100, rps=10)
    for _ in range(10):
        report(state, state.get_shard("train", W(0)).shard, W(0))
    saved = state.snapshot(["train"])
    saved.datasets[0].cursor = 10
    mutate(saved)
    before = state.snapshot().SerializeToString()
    with pytest.raises(error, match=match):
        state.restore_state(saved)
    assert state.snapshot().SerializeToString() == before


def test_restore_rejects_shards_beyond_the_cursor():
    state, _ = make(records=100, rps=10)
    saved = state.snapshot(["train"])
    saved.datasets[0].cursor = 2
    saved.datasets[0].requeued.add(shard_id=5)
    with pytest.raises(InvalidRequest, match="never issued"):
        state.restore_state(saved)


@given(seed=st.integers(0, 10**6), workers=st.integers(1, 4), epochs=st.integers(1, 2),
       rps=st.integers(1, 7))
@settings(deadline=None)
def test_random_interleavings_count_every_record_exactly_once(seed, workers, epochs, rps):
    """Random GetShard / DONE / FAILED / PROGRESS / death / relaunch / expiry / duplicate
    / restore sequences: every record is counted once per epoch, whatever happens."""
    rng = random.Random(seed)
    records = rng.randint(1, 60)
    state, clock = make(records=records, rps=rps, epochs=epochs, shuffle=True,
                        min_seconds=1, initial_seconds=5, max_failures=1000)
    inc = [0] * workers
    held = {w: [] for w in range(workers)}
    trained = {}  # (epoch, record) -> times, from accepted DONE / applied progress
    applied = {}  # lease -> records counted so far

    def count(shard, upto):
        for r in range(shard.start + applied.get(shard.lease_id, 0), shard.start + upto):
            trained[(shard.epoch, r)] = trained.get((shard.epoch, r), 0) + 1
        applied[shard.lease_id] = upto

    saved = None
    for _ in range(2000):
        w = rng.randrange(workers)
        task = W(w, inc[w])
        op = rng.random()
        if op < 0.45 or not held[w]:
            r = state.get_shard("train", task)
            if r.status == SHARD:
                held[w].append(r.shard)
            elif r.status == END:
                break
            else:
                clock.now += 0.5
                state.expire_leases()
            continue
        s = held[w].pop(rng.randrange(len(held[w])))
        try:
            if op < 0.75:
                report(state, s, task)
                count(s, s.length)
                if rng.random() < 0.2:
                    assert report(state, s, task).result == pb.ReportShardResponse.DUPLICATE
            elif op < 0.82:
                k = rng.randint(applied.get(s.lease_id, 0), s.length)
                report(state, s, task, FAILED, records=k)
                count(s, k)
            elif op < 0.88:
                k = rng.randint(applied.get(s.lease_id, 0), s.length)
                report(state, s, task, PROGRESS, records=k)
                count(s, k)
                held[w].append(s)
            elif op < 0.92:
                state.report_task_failure(task)
                inc[w] += 1
                held[w].clear()
            elif op < 0.96:
                clock.now += 100
                state.expire_leases()
            elif op < 0.98 and saved is None:
                saved = state.snapshot(["train"], with_tasks=False)
                saved_trained = dict(trained)
                held[w].append(s)
            elif saved is not None:
                state.restore_state(saved)
                trained = saved_trained
                saved = None
                for h in held.values():
                    h.clear()
            else:
                held[w].append(s)
        except (LeaseNotHeld, StaleIncarnation):
            pass
    # finish whatever is left with a fresh worker
    finisher = W(workers)
    for _ in range(10 * records * epochs + 100):   # bounded: a stuck state fails, not hangs
        clock.now += 100
        state.expire_leases()
        r = state.get_shard("train", finisher)
        if r.status == END:
            break
        if r.status == SHARD:
            report(state, r.shard, finisher)
            count(r.shard, r.shard.length)
    else:
        pytest.fail("the dataset never reached END")
    p = progress(state)
    assert p.finished and p.records_done_total == records * epochs
    assert sorted(trained) == [(e, r) for e in range(epochs) for r in range(records)]
    assert set(trained.values()) == {1}


def test_restoring_a_fully_trained_doing_shard_finishes_the_epoch():
    state, _ = make(records=20, rps=10)
    a = state.get_shard("train", W(0)).shard
    report(state, a, W(0))
    b = state.get_shard("train", W(0)).shard
    report(state, b, W(0), PROGRESS, records=10)   # all trained, DONE not yet sent
    saved = state.snapshot(["train"])
    state.restore_state(saved)
    assert progress(state).finished
    assert state.get_shard("train", W(1)).status == END


def make_static(records=90, rps=10, workers=3, epochs=1):
    clock = Clock()
    state = ShardState(LeaseConfig(), clock=clock)
    state.register_dataset(DatasetSpec("train", records_per_shard=rps, num_records=records,
                                       num_epochs=epochs, shuffle=True, seed=3,
                                       static_workers=workers))
    return state, clock


def test_static_sharding_gives_each_worker_only_its_block_of_the_epoch():
    state, _ = make_static(records=95, epochs=2)     # 10 shards: blocks of 4, 3, 3
    run = state._runs["train"]
    blocks = lambda: [[run.order(p) for p in r] for r in (range(0, 4), range(4, 7),  # noqa
                                                            range(7, 10))]
    first = blocks()
    shards = lambda ranges: [start // 10 for start, _ in ranges]  # noqa: E731
    ranges0, status0 = drain(state, W(0))
    ranges1, status1 = drain(state, W(1))
    assert (shards(ranges0), status0) == (first[0], WAIT)   # the others' shards are not for it
    assert (shards(ranges1), status1) == (first[1], WAIT)
    ranges2, status2 = drain(state, W(2))       # finishes epoch 0, then its block of epoch 1
    second = blocks()
    assert second != first                       # reshuffled per epoch
    assert (shards(ranges2), status2) == (first[2] + second[2], WAIT)
    assert shards(drain(state, W(0))[0]) == second[0]
    ranges1, status1 = drain(state, W(1))
    assert (shards(ranges1), status1) == (second[1], END)
    assert progress(state).finished and progress(state).records_done_total == 190


def test_static_sharding_a_dead_workers_shards_wait_for_its_relaunch():
    state, _ = make_static()
    held = state.get_shard("train", W(0)).shard
    report(state, held, W(0), PROGRESS, records=4)
    state.report_task_failure(W(0))
    ranges, status = drain(state, W(1))
    assert status == WAIT and len(ranges) == 3          # only its own block, not w0's
    back = state.get_shard("train", W(0, incarnation=1)).shard
    assert (back.shard_id, back.start, back.length) == (held.shard_id, held.start + 4, 6)
    report(state, back, W(0, 1))
    drain(state, W(0, 1))
    assert drain(state, W(2))[1] == END
    assert progress(state).records_done_total == 90


def test_static_sharding_survives_snapshot_restore():
    state, _ = make_static()
    drain(state, W(1))
    saved = state.snapshot(["train"], with_tasks=False)
    drain(state, W(0))
    state.restore_state(saved)
    assert drain(state, W(1)) == ([], WAIT)              # its block was done at the snapshot
    assert len(drain(state, W(0))[0]) == 3
    assert drain(state, W(2))[1] == END
    p = progress(state)
    assert p.finished and p.records_done_total == 90     # counts roll back with the state


def test_tail_stealing_takes_the_rest_of_a_slow_workers_lease_one_batch_ahead():
    clock = Clock()
    state = ShardState(LeaseConfig(), clock=clock)
    state.register_dataset(DatasetSpec("train", records_per_shard=100, num_records=400,
                                       tail_stealing=True))
    slow, fast = W(0), W(1)
    a = state.get_shard("train", slow).shard
    clock.now += 10                                  # 0.1 s per record
    report(state, a, slow)
    b = state.get_shard("train", slow).shard
    for _ in range(2):
        c = state.get_shard("train", fast).shard
        clock.now += 1                               # 0.01 s per record
        report(state, c, fast)
    report(state, b, slow, PROGRESS, records=10)
    report(state, b, slow, PROGRESS, records=20)     # batches of 10
    stolen = state.get_shard("train", fast)          # nothing TODO: it takes b's rest
    assert stolen.status == SHARD
    assert (stolen.shard.shard_id, stolen.shard.start, stolen.shard.length) == (
        b.shard_id, b.start + 30, 70)                # after the batch slow is training now
    with pytest.raises(LeaseNotHeld):                # slow learns it from its next report
        report(state, b, slow, PROGRESS, records=30)
    report(state, stolen.shard, fast)
    assert state.get_shard("train", slow).status == END
    p = progress(state)
    assert p.finished and p.records_done_total == 400 and p.stolen_leases == 1
    assert [t.failures for t in state.progress("train").tasks] == [0, 0]


def _slow_holder(records=400, **spec):
    """worker 0 slow (0.1 s/record), worker 1 fast (0.01 s/record); worker 0 holds a
    lease with 20 of 100 records reported (batches of 10), nothing else TODO.
    ``spec``: DatasetSpec options (backup_leases / tail_stealing)."""
    clock = Clock()
    state = ShardState(LeaseConfig(), clock=clock)
    state.register_dataset(DatasetSpec("train", records_per_shard=100, num_records=records,
                                       **spec))
    slow, fast = W(0), W(1)
    a = state.get_shard("train", slow).shard
    clock.now += 10
    report(state, a, slow)
    held = state.get_shard("train", slow).shard
    for _ in range(records // 100 - 2):
        c = state.get_shard("train", fast).shard
        clock.now += 1
        report(state, c, fast)
    report(state, held, slow, PROGRESS, records=10)
    report(state, held, slow, PROGRESS, records=20)
    return state, clock, slow, fast, held


def test_a_backup_lease_duplicates_the_rest_and_the_first_finisher_wins():
    state, clock, slow, fast, held = _slow_holder(backup_leases=True)
    dup = state.get_shard("train", fast)
    assert dup.status == SHARD                       # a duplicate from the last report on
    assert (dup.shard.shard_id, dup.shard.start, dup.shard.length) == (
        held.shard_id, held.start + 20, 80)
    p = progress(state)
    assert p.backup_leases == 1 and p.doing_shards == 1 and p.done_shards == 3
    assert state.get_shard("train", slow).status == WAIT   # one duplicate per lease
    report(state, held, slow, PROGRESS, records=30)  # both train: counted once
    report(state, dup.shard, fast, PROGRESS, records=20)
    assert progress(state).records_done_epoch == 300 + 40
    report(state, dup.shard, fast)                   # the duplicate finishes first
    with pytest.raises(LeaseNotHeld):                # the original learns it next report
        report(state, held, slow, PROGRESS, records=40)
    p = progress(state)
    assert p.finished and p.records_done_epoch == 400 and p.doing_shards == 0
    assert [t.failures for t in state.progress("train").tasks] == [0, 0]


def test_the_original_may_finish_first_and_a_dead_partner_loses_nothing():
    state, clock, slow, fast, held = _slow_holder(backup_leases=True)
    dup = state.get_shard("train", fast).shard
    report(state, held, slow)                        # the original wins this time
    with pytest.raises(LeaseNotHeld):
        report(state, dup, fast, PROGRESS, records=10)
    assert progress(state).finished and progress(state).records_done_epoch == 400
    # the original's holder dies: the duplicate covers the rest, nothing goes back TODO
    state, clock, slow, fast, held = _slow_holder(backup_leases=True)
    dup = state.get_shard("train", fast).shard
    report(state, dup, fast, PROGRESS, records=50)  # reaches record 70 of the shard
    state.report_task_failure(slow)
    assert progress(state).todo_shards == 0
    # ... and when the duplicate dies too, the rest goes back from as far as both got
    state.report_task_failure(fast)
    again = state.get_shard("train", W(2)).shard
    assert (again.shard_id, again.start, again.length) == (held.shard_id, held.start + 70, 30)
    report(state, again, W(2))
    assert progress(state).finished and progress(state).records_done_epoch == 400


def test_backup_pairs_survive_snapshot_load_and_restore():
    state, clock, slow, fast, held = _slow_holder(backup_leases=True)
    dup = state.get_shard("train", fast).shard
    report(state, dup, fast, PROGRESS, records=30)
    snap = state.snapshot()
    (orig_row,) = [r for r in snap.datasets[0].doing if not r.backup_of]
    (dup_row,) = [r for r in snap.datasets[0].doing if r.backup_of]
    assert dup_row.backup_of == orig_row.lease_id == held.lease_id
    loaded = ShardState(LeaseConfig(), clock=clock)  # a master restart: both keep going
    loaded.load(snap)
    report(loaded, dup, fast)
    with pytest.raises(LeaseNotHeld):
        report(loaded, held, slow, PROGRESS, records=30)
    assert progress(loaded).finished and progress(loaded).records_done_epoch == 400
    state.restore_state(snap)                        # a checkpoint restore: TODO once
    again = state.get_shard("train", W(2)).shard
    assert (again.shard_id, again.start) == (held.shard_id, held.start + 50)
    assert state.get_shard("train", W(3)).status == WAIT
    bad = pb.ShardingState()
    bad.CopyFrom(snap)
    bad.datasets[0].doing[1].backup_of = 999         # duplicates nothing
    with pytest.raises(CorruptState, match="duplicates lease"):
        ShardState(LeaseConfig(), clock=clock).load(bad)


def test_a_checkpoint_does_not_claim_a_stolen_leases_unreported_batch():
    """The steal counts the holder's batch in flight as applied. A checkpoint taken with
    no step in flight before the holder reported that batch (it waited in the holder's
    pipeline while the trainer drained) must not: restored, that batch is TODO again."""
    state, clock, slow, fast, b = _slow_holder(tail_stealing=True)
    stolen = state.get_shard("train", fast).shard
    assert stolen.start == b.start + 30
    ckpt = state.snapshot(for_checkpoint=True, with_tasks=False)
    (rest,) = ckpt.datasets[0].doing
    assert (rest.offset, rest.applied) == (20, 0)    # from the holder's last report
    assert state.snapshot().datasets[0].doing[0].offset == 30   # the live state: as is
    with pytest.raises(LeaseNotHeld):                # the holder applied it and says so
        report(state, b, slow, PROGRESS, records=30)
    assert state.snapshot(for_checkpoint=True).datasets[0].doing[0].offset == 30
    state.restore_state(ckpt)                        # the early checkpoint restored
    again = state.get_shard("train", fast).shard
    assert (again.shard_id, again.start, again.length) == (b.shard_id, b.start + 20, 80)


def test_tail_stealing_takes_a_prefetched_lease_after_its_first_batch():
    """A slow worker's lease it has not reported on yet (prefetched) is left alone: the
    batch counted in flight would be lost if the job ended before the holder got to it.
    Once the holder reported its first batch, the rest is stolen one batch ahead."""
    clock = Clock()
    state = ShardState(LeaseConfig(), clock=clock)
    state.register_dataset(DatasetSpec("train", records_per_shard=100, num_records=400,
                                       tail_stealing=True))
    slow, fast = W(0), W(1)
    a = state.get_shard("train", slow).shard
    report(state, a, slow, PROGRESS, records=10)     # batches of 10
    clock.now += 10                                  # 0.1 s per record
    report(state, a, slow)
    b = state.get_shard("train", slow).shard         # prefetched: not reported on yet
    for _ in range(2):
        c = state.get_shard("train", fast).shard
        clock.now += 1
        report(state, c, fast)
    assert state.get_shard("train", fast).status == WAIT      # b is not reported on yet
    report(state, b, slow, PROGRESS, records=10)
    stolen = state.get_shard("train", fast)
    assert stolen.status == SHARD
    assert (stolen.shard.shard_id, stolen.shard.start, stolen.shard.length) == (
        b.shard_id, b.start + 20, 80)                # its next batch stays with slow
    with pytest.raises(LeaseNotHeld):
        report(state, b, slow, PROGRESS, records=20)
    report(state, stolen.shard, fast)
    p = progress(state)
    assert p.finished and p.records_done_total == 400 and p.stolen_leases == 1


def test_tail_stealing_judges_a_holder_by_its_pace_on_the_lease():
    """A worker that never finished a lease (slow from the start, one long shard) is
    judged by its pace on the lease it holds."""
    clock = Clock()
    state = ShardState(LeaseConfig(), clock=clock)
    state.register_dataset(DatasetSpec("train", records_per_shard=100, num_records=300,
                                       tail_stealing=True))
    slow, fast = W(0), W(1)
    held = state.get_shard("train", slow).shard
    for i in range(2):
        c = state.get_shard("train", fast).shard
        clock.now += 1                               # 0.01 s per record
        report(state, c, fast)
        if i == 0:
            report(state, held, slow, PROGRESS, records=10)   # 0.1 s per record
    stolen = state.get_shard("train", fast)
    assert (stolen.status, stolen.shard.start) == (SHARD, held.start + 20)


def test_tail_stealing_needs_the_holders_batch_size():
    clock = Clock()
    state = ShardState(LeaseConfig(), clock=clock)
    state.register_dataset(DatasetSpec("train", records_per_shard=100, num_records=300,
                                       tail_stealing=True))
    slow, fast = W(0), W(1)
    a = state.get_shard("train", slow).shard
    clock.now += 10
    report(state, a, slow)                           # DONE at once: batch size unknown
    state.get_shard("train", slow)
    c = state.get_shard("train", fast).shard
    clock.now += 1
    report(state, c, fast)
    assert state.get_shard("train", fast).status == WAIT
    assert progress(state).stolen_leases == 0


def test_tail_stealing_leaves_leases_alone_when_it_would_not_pay():
    clock = Clock()
    state = ShardState(LeaseConfig(), clock=clock)
    state.register_dataset(DatasetSpec("train", records_per_shard=100, num_records=300,
                                       tail_stealing=True))
    w0, w1 = W(0), W(1)
    for w in (w0, w1):                               # equally fast
        s = state.get_shard("train", w).shard
        clock.now += 1
        report(state, s, w)
    held = state.get_shard("train", w0).shard
    report(state, held, w0, PROGRESS, records=10)
    assert state.get_shard("train", w1).status == WAIT
    report(state, held, w0, PROGRESS, records=85)    # a slow one, but too little left
    assert progress(state).stolen_leases == 0
    with pytest.raises(InvalidRequest, match="static sharding excludes"):
        DatasetSpec("x", records_per_shard=1, num_records=2, static_workers=2,
                    tail_stealing=True)
    with pytest.raises(InvalidRequest, match="exclude each other"):
        DatasetSpec("x", records_per_shard=1, num_records=2, backup_leases=True,
                    tail_stealing=True)
