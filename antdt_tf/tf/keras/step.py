"""The step that keeps the master's ledger exact under ``model.fit``: a graph function
that wraps the model's own ``train_step`` (what :meth:`ShardingCallback.attach`
installs), and the PS variables it reads and writes.

On every batch of :func:`~antdt_tf.tf.keras.data.dataset_creator` the step:

1. removes ``record_id`` and ``antdt`` (the lease position) from the features: the
   model's ``train_step`` gets ``(features, label, sample_weight)`` as ``parse`` made them;
2. sets the sample weight to 0 for padding batches (after the data ended, or while the
   master has nothing for this worker) and for the rest of a lease the master refused
   (it expired while its worker was silent: another worker trains it);
3. (sparse reports) writes where the lease was before this batch on the PS, then calls
   the model's ``train_step`` (so a kill that lets any of its updates land finds the
   record current), and reports to the master only after every variable update of the
   step has landed.
"""

from __future__ import annotations

import functools

import tensorflow as tf
import tf_keras as keras   # the [tf] extra installs it; TF_USE_LEGACY_KERAS=1 makes it tf.keras

from antdt_tf.tf.accounting import (lease_record_shape, lease_record_update, report_applied,
                                    report_due_tensor, run_step)

_META = ("lease", "shard", "epoch", "applied", "length", "sparse")


def worker_state_variable(strategy, slots: int) -> tf.Variable:
    """Per worker: (a lease the master refused a report of — expired while its holder
    was silent, restored: its further batches are skipped; with sparse reports the
    worker's own time and steps since its last report, the Monitor's BPT: gaps between
    reports would count as idle time). One variable, read and written unconditionally:
    a PS op inside a tf.cond costs the step more than the op itself (keras_step_cost)."""
    with strategy.scope():
        return tf.Variable(tf.tile(tf.constant([[-1, 0, 0]], tf.int64), [slots, 1]),
                           trainable=False, name="antdt_worker_state")


def lease_record_variable(strategy, slots: int) -> tf.Variable:
    """Sparse reports: the PS lease record the chief settles dead workers' leases from.
    Not checkpointed: a restore re-issues every lease anyway; one row more than the
    trainers' record (:func:`spare_row`): padding batches write there (no tf.cond)."""
    rows, cols = lease_record_shape(slots)
    with strategy.scope():
        return tf.Variable(tf.fill([rows + 1, cols], tf.constant(-1, tf.int64)),
                           trainable=False, name="antdt_lease_record")


def spare_row(slots: int) -> int:
    """The lease record's extra last row, which padding and skipped batches write and
    nothing reads."""
    return lease_record_shape(slots)[0]


def audit_variables(strategy, records: int):
    """Audit mode: ``(applied, started)`` per record id. applied: steps all of whose
    updates landed; started: steps that began writing (a kill between the two leaves a
    torn step: started > applied)."""
    with strategy.scope():
        applied = tf.Variable(tf.zeros([records], tf.int32),
                              trainable=False, name="antdt_applied")
        started = tf.Variable(tf.zeros([records], tf.int32),
                              trainable=False, name="antdt_started")
    return applied, started


class ReportingStep:
    """The wrapped ``train_step`` (see the module docstring): call it with a batch of
    :func:`~antdt_tf.tf.keras.data.dataset_creator` inside ``fit``'s train function.

    ``original``: the model's own ``train_step``. ``worker_state``:
    :func:`worker_state_variable`. ``lease_record`` / ``record_spare_row`` (sparse
    reports): :func:`lease_record_variable` / :func:`spare_row`. ``applied`` /
    ``started`` (audit): :func:`audit_variables`. ``sparse``: report a lease only when
    :func:`~antdt_tf.tf.accounting.report_due_tensor` says so, with the worker's time."""

    def __init__(self, original, master: str, dataset: str, timeout_ms: int, worker_state,
                 lease_record=None, record_spare_row=None, applied=None, started=None,
                 sparse: bool = False):
        self.original = original
        self.master, self.dataset, self.timeout_ms = master, dataset, timeout_ms
        self.worker_state, self.lease_record = worker_state, lease_record
        self.record_spare_row = record_spare_row
        self.applied, self.started = applied, started
        self.sparse = sparse

    def __call__(self, data):
        start = tf.timestamp()    # the batch is here: the step's own time from now
        x, y, w = keras.utils.unpack_x_y_sample_weight(data)
        x = dict(x)
        meta, ids = x.pop("antdt"), x.pop("record_id")
        row = tf.reshape(meta["worker"], [1])
        vec = {k: tf.reshape(meta[k], [-1]) for k in _META}
        lease = tf.reduce_max(vec["lease"])   # a batch never spans leases
        # the worker's row, read once: only this worker's steps write it, one at a
        # time, and each step's write is ordered before the next step's read (one
        # resource) — so it is current, and nothing waits on another read later
        state = tf.reshape(tf.gather(self.worker_state, row), [3])
        w, real = self._weights(w, vec["lease"], lease, refused=state[0])
        any_real = tf.reduce_any(real)
        n = tf.reduce_sum(tf.cast(real, tf.int64))
        report = {k: tf.boolean_mask(vec[k], real)
                  for k in ("lease", "shard", "epoch", "applied")}
        due = any_real
        if self.sparse:   # (padding rows have no lease: only real batches are due)
            due = tf.logical_and(any_real, report_due_tensor(
                True, tf.reduce_min(vec["sparse"]), tf.reduce_max(vec["applied"]),
                tf.reduce_max(vec["length"])))
        # the report goes out only after every update of the step has landed
        logs, effects = self._run(functools.partial(
            self._model_step, (x, y, w), meta, lease, vec["applied"], n, any_real), ids, real)
        zero = tf.constant(0, tf.int64)

        def send():
            timing = dict(micros=state[1] + this, steps=state[2] + 1) if self.sparse else {}
            return report_applied(self.master, self.dataset, dict(
                report, worker=meta["worker"], incarnation=meta["incarnation"]),
                self.timeout_ms, **timing)

        with tf.control_dependencies(effects):
            this = tf.cast((tf.timestamp() - start) * 1e6, tf.int64)
            rejected = tf.cond(due, send, lambda: zero)   # the RPC runs on the worker
        # one unconditional update of the row: a refused lease noted; the time
        # added up, or reset once reported
        if self.sparse:
            timing = tf.where(due, -state[1:], tf.where(
                any_real, tf.stack([this, tf.constant(1, tf.int64)]),
                tf.zeros([2], tf.int64)))
        else:
            timing = tf.zeros([2], tf.int64)
        delta = tf.concat([tf.reshape(tf.where(rejected > 0, lease - state[0], zero), [1]),
                           timing], 0)
        self.worker_state.scatter_add(tf.IndexedSlices(tf.reshape(delta, [1, 3]), row))
        return logs

    @staticmethod
    def _weights(w, leases, lease, refused):
        """``(sample_weight, real)``: a refused lease is not this worker's any more: its
        batch trains with sample weight 0 (no gradient for SGD) and counts nowhere;
        padding rows (lease -1) are not real either."""
        skip = tf.logical_and(lease >= 0, tf.equal(refused, lease))
        keep = tf.cast(tf.logical_not(skip), tf.float32)
        w = keep * tf.ones_like(leases, tf.float32) if w is None else (
            w * tf.cast(keep, w.dtype))
        return w, tf.logical_and(leases >= 0, tf.logical_not(skip))

    def _model_step(self, data, meta, lease, applied, n, any_real):
        """The model's own ``train_step``, after (sparse reports) the lease record write."""
        if self.lease_record is None:
            return self.original(data)
        # where the lease was *before* this batch, written before any update of the
        # step: if a kill lets any of them land, the record says so, and the settle
        # re-trains this batch only (written beside them, a kill could land updates but
        # not the record: the batch before, applied in full, would be trained again too
        # — two batches). A padding or skipped batch writes the spare row.
        written = lease_record_update(
            self.lease_record, meta["worker"], meta["incarnation"], lease,
            tf.reduce_max(applied) - n, n, real=any_real, spare_row=self.record_spare_row)
        with tf.control_dependencies([written]):
            return self.original(data)

    def _run(self, step, ids, real):
        """Runs ``step`` and returns ``(logs, effects)``: every stateful op to wait for."""
        if self.started is None:
            return run_step(step)
        # audit: `started` before any update of the step, `applied` after all of
        # them — a step cut by a kill counts in `started` only (see applied_counts)
        real_ids = tf.boolean_mask(tf.reshape(ids, [-1]), real)
        ones = tf.IndexedSlices(tf.ones_like(real_ids, tf.int32), real_ids)
        # (run_step collects the ops: a partitioned counter, a ShardedVariable,
        # returns neither a tensor nor an op)
        _, begun = run_step(lambda: self.started.scatter_add(ones))
        with tf.control_dependencies(begun):
            logs, effects = run_step(step)
        with tf.control_dependencies(effects):
            _, counted = run_step(lambda: self.applied.scatter_add(ones))
        return logs, effects + counted
