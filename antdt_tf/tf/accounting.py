"""Step accounting: what a training step applied, when the worker tells the master,
and the PS record that bounds what a failure repeats.

The model every trainer follows (``PullTrainer``, the Keras step, BSP rounds and the
TF1 hooks; ``ShardTrainer`` reports whole shards): a batch of
:func:`~antdt_tf.tf.pull.pull_dataset` carries its lease and its records' positions in
it; after the step has applied the batch (:func:`run_step` finds the step's effects to
order the report after), the worker reports how far the lease got (:func:`send_report`, :func:`report_applied`) —
with sparse reports only when the report is due (:func:`report_due_tensor`, the graph
twin of :func:`antdt_tf.sharding.tf_rpc_client.report_due`), the step writing its
position into the PS lease record (:func:`lease_record_update`) instead, from which the
chief settles a dead worker's leases (:func:`apply_lease_records`). What differs between
the trainers is where this runs — inside a ``tf.while_loop`` of many steps, a Keras
``train_step``, a chief's round, a ``SessionRunHook`` — not the rules.

Sparse reports (the default of every trainer that can read the PS): the per-batch record
moves from the master to the PS — each step writes how far its lease got into a PS
variable beside its gradients — and the master hears of a lease only when it is
finished (and at the end of each closure). The one-batch bound holds because the master
*holds* a dead holder's sparse leases (instead of re-issuing them from its older count)
until the trainer, which can read the PS, settles them from the record. Leases that may
be stolen or backed up (an epoch's tail, slow holders) stay reported per batch.
"""

from __future__ import annotations

import contextlib
import logging

import tensorflow as tf

from antdt_tf.tf.master_rpc import DEFAULT_TIMEOUT_MS, rpc_call, rpc_client
from antdt_tf.tf.tf_internals import is_stateful


def report_due_tensor(sparse_reports: bool, lease_sparse, applied, length):
    """:func:`antdt_tf.sharding.tf_rpc_client.report_due` as graph ops (scalar tensors
    in, a bool tensor out; without sparse reports a constant): the one report rule of
    ``PullTrainer``, the Keras step and the TF1 hooks."""
    if not sparse_reports:
        return tf.constant(True)
    return tf.logical_or(tf.equal(lease_sparse, 0), tf.greater_equal(applied, length))


# stateful only in that they read a resource: nothing to wait for before a report
_READS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd",
                    "VarIsInitializedOp", "VariableShape"})


def run_step(step_fn, *args):
    """Calls ``step_fn(*args)`` while a graph function is built and returns
    ``(result, effects)``: every stateful op the step created.

    Run the report to the master under ``tf.control_dependencies(effects)``. Automatic
    control dependencies order ops only per resource, and the report is an RPC op on its
    own client resource: without this it may run *before* the step's variable updates
    land, and a worker killed in between leaves records the master counts as applied
    but the model never saw (found in CI: a lost batch after a worker SIGKILL)."""
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    result = step_fn(*args)
    effects = [op for op in graph.get_operations()[first:]
               if is_stateful(op) and op.type not in _READS]
    return result, effects


def send_report(master: str, dataset: str, worker, incarnation, leases, shards, epochs,
                applied, micros=None, steps=None, timeout_ms: int = DEFAULT_TIMEOUT_MS):
    """``antdt.report``: ``applied[i]`` records of ``leases[i]`` (from its start) are
    trained. ``micros``/``steps``: the worker's own time in the steps since its previous
    report (the Monitor's BPT; without them the master times the gap, one step).
    Returns how many of the leases the master rejected: a rejected lease is no longer
    this worker's (taken over by tail stealing, expired, revoked), its further batches
    must not be applied. The one builder of the call's arguments for every trainer."""
    args = [tf.constant(dataset), tf.reshape(tf.cast(worker, tf.int64), []),
            tf.reshape(tf.cast(incarnation, tf.int64), []), leases, shards,
            tf.cast(epochs, tf.int32), applied]
    if micros is not None:
        args += [tf.cast(micros, tf.int64), tf.cast(steps, tf.int64)]
    (rejected,) = rpc_call(rpc_client(master, timeout_ms, "report"), "antdt.report", args,
                           [tf.int64], timeout_ms)
    return rejected


def report_applied(master: str, dataset: str, meta: dict,
                   timeout_ms: int = DEFAULT_TIMEOUT_MS, micros=None, steps=None):
    """Tells the master how far each lease in a trained batch got (a batch of
    :func:`~antdt_tf.tf.pull.pull_dataset`'s, or its real records: ``meta``'s per-record ``lease``,
    ``shard``, ``epoch``, ``applied`` and the batch's ``worker``, ``incarnation``). Call
    after the step (in the same tf.function, under ``tf.control_dependencies`` on the
    step's effects: see :func:`run_step`). Returns the rejected count of
    :func:`send_report` (``micros``/``steps``: as there). (What the batch counts for the
    worker's own counters: :func:`batch_counts`.)"""
    leases, idx = tf.unique(meta["lease"])
    n = tf.shape(leases)[0]
    return send_report(master, dataset, meta["worker"], meta["incarnation"], leases,
                       tf.math.unsorted_segment_max(meta["shard"], idx, n),
                       tf.math.unsorted_segment_max(meta["epoch"], idx, n),
                       tf.math.unsorted_segment_max(meta["applied"], idx, n),
                       micros=micros, steps=steps, timeout_ms=timeout_ms)


def batch_counts(meta):
    """``[records, leases finished]`` of a pulled batch, from its metadata alone (a
    batch never spans leases, so its last record finishes the lease or not)."""
    records = tf.shape(meta["lease"], out_type=tf.int64)[0]
    finished = tf.cast(tf.logical_and(
        records > 0, tf.equal(tf.reduce_max(meta["applied"]), tf.reduce_max(meta["length"]))),
        tf.int64)
    return tf.stack([records, finished])


def lease_record_shape(worker_slots: int) -> list[int]:
    """The lease record's shape: two rows per worker slot, chosen by the incarnation's
    parity (the master alternates it, so a relaunched worker does not overwrite the row
    of the incarnation that died before the trainer settled it); each row
    ``(incarnation, lease, applied before the batch, the batch's records)``."""
    return [2 * worker_slots, 4]


def lease_record_update(record, worker, incarnation, lease, before, records,
                        real=None, spare_row=None):
    """Sparse reports, the recording side: the op that writes ``(incarnation, lease,
    applied before the batch, records in the batch)`` into the worker's row of
    ``record`` (an int64 variable on the PS, :func:`lease_record_shape`). Run it beside
    the step's updates: where the lease was *before* the batch is a fact once the step
    runs; ``before + records`` is where it is once the step has landed, which only a
    trainer that drained its steps may assume. :func:`apply_lease_records` reads the
    rows back. Every trainer's step uses this.

    ``real`` (a bool tensor) and ``spare_row`` (a row past the workers', filled with -1):
    a batch with no real records writes -1s there instead — for a step that writes
    unconditionally, without a ``tf.cond`` around a PS op."""
    def i64(v):
        return tf.cast(tf.reshape(v, []), tf.int64)

    incarnation = i64(incarnation)
    row = 2 * i64(worker) + tf.math.floormod(incarnation, 2)
    values = tf.stack([incarnation, i64(lease), i64(before), i64(records)])
    if real is not None:
        row = tf.where(real, row, tf.constant(spare_row, tf.int64))
        values = tf.where(real, values, tf.constant(-1, tf.int64))
    # one tensor crosses to the PS, not two: every tensor a PS op takes from the worker
    # is a transfer of its own (the gain was within the step probes' noise, ±0.3 ms)
    packed = tf.concat([tf.reshape(row, [1]), values], 0)
    # (a ShardedVariable, under a partitioner that splits even this, has no one device)
    device = getattr(record, "device", None)
    with tf.device(device) if device else contextlib.nullcontext():
        return record.scatter_update(tf.IndexedSlices(tf.reshape(packed[1:], [1, 4]),
                                                      packed[:1]))


def apply_lease_records(record_fn, dataset: str, rows, held=(), drained: bool = False) -> None:
    """Sparse reports, the settling side: tells the master how far each worker's latest
    lease got, from the record rows on the PS (:func:`lease_record_update`), and settles
    ``held`` leases (``DatasetProgress.held``; a lease without a row is settled at the
    master's own count, which is then exact: its holder trained no batch of it after its
    last report). A row counts up to *before* its batch — the batch may not have landed
    (a kill repeats at most that one batch) — unless ``drained``: every step the trainer
    scheduled has finished (its checkpoint drain), so a live holder's last batch is in
    the model and counts too (a held lease's holder died: its batch stays uncounted).
    ``record_fn``: ``ShardingClient.apply_lease_record``. Shared by :class:`PullTrainer`,
    the Keras callback and the TF1 chief's ``LeaseSettleHook``."""
    from antdt_tf.proto import sharding_pb2 as pb

    dead = {(h.lease_id, h.holder.incarnation) for h in held}
    sent = set()
    for row, (incarnation, lease, before, records) in enumerate(
            [int(v) for v in r] for r in rows):
        if incarnation >= 0 and lease >= 0:
            holder = pb.TaskId(type="worker", index=row // 2, incarnation=incarnation)
            landed = drained and (lease, incarnation) not in dead
            record_fn(dataset, lease, holder, before + records if landed else before)
            sent.add((lease, incarnation))
    for h in held:
        if (h.lease_id, h.holder.incarnation) not in sent:
            record_fn(dataset, h.lease_id, h.holder, -1)
    if held:
        logging.info("settled %d held lease(s) of a dead or silent worker from the PS "
                     "record: %s", len(held), ", ".join(
                         f"{h.lease_id} (worker {h.holder.index}, {h.applied} reported)"
                         for h in held))
