"""The PS lease record of sparse reports, on its own: the row each step writes (its
worker's row, by incarnation parity) and what the chief settles from the rows
(``apply_lease_records``)."""

import tensorflow as tf

from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.tf.accounting import apply_lease_records, lease_record_shape, lease_record_update


def record(slots: int) -> tf.Variable:
    return tf.Variable(tf.fill(lease_record_shape(slots), tf.constant(-1, tf.int64)))


def test_rows_by_worker_and_incarnation_parity():
    r = record(2)
    lease_record_update(r, 1, 7, lease=30, before=256, records=256)    # odd: row 3
    lease_record_update(r, 0, 10, lease=31, before=0, records=100)     # even: row 0
    assert r.numpy().tolist() == [[10, 31, 0, 100], [-1] * 4, [-1] * 4, [7, 30, 256, 256]]


def test_settling_counts_to_before_the_batch_unless_drained():
    r = record(2)
    lease_record_update(r, 1, 7, 30, 256, 256)
    lease_record_update(r, 0, 10, 31, 0, 100)
    sent = []

    def record_fn(dataset, lease, holder, applied):
        sent.append((dataset, lease, holder.index, holder.incarnation, applied))
        return True
    dead = pb.HeldLease(lease_id=30, applied=0,
                        holder=pb.TaskId(type="worker", index=1, incarnation=7))
    unrecorded = pb.HeldLease(lease_id=40, applied=512,
                              holder=pb.TaskId(type="worker", index=1, incarnation=7))
    apply_lease_records(record_fn, "d", r.numpy(), held=[dead, unrecorded], drained=True)
    # the live worker's last batch landed (drained); the dead holder's may not have; a held
    # lease without a row is settled at the master's own count (-1)
    assert sorted(sent) == [("d", 30, 1, 7, 256), ("d", 31, 0, 10, 100), ("d", 40, 1, 7, -1)]
    # not drained (a live worker's last batch may still be in flight): up to before it
    sent.clear()
    apply_lease_records(record_fn, "d", r.numpy())
    assert sorted(sent) == [("d", 30, 1, 7, 256), ("d", 31, 0, 10, 0)]
