"""BSP mode: synchronous rounds over ``ClusterCoordinator``, fed by the master.

What a round means (the semantics users get):

- In round *r* every worker computes the gradient of **one batch of its own pulled
  data** against the same parameters — those after round *r-1* — and stages it on the
  PS. When all of the round's batches are staged, the chief applies their
  records-weighted mean once: one SGD step over a global batch of ``sum(b_i)`` records.
  Only then does the chief tell the master which records were applied. Parameters never
  change inside a round, so no gradient is stale.
- The round ends when its slowest worker is done (the barrier): one slow worker slows
  every round. ADJUST_BS is the cure: the Controller sets each worker's batch size in
  proportion to its measured speed, keeping the global batch constant, so every worker
  finishes its part of the round at the same time (``SetBatchSizes``; a worker switches
  at its next lease, a step boundary). A worker's step time (``antdt.step``) runs from
  the round's start (the chief's clock, sent with the closure) until its batch is
  staged (the worker's clock): what the round waits for, including the time before the
  worker even starts the closure (a throttled or busy process) — not arrival times at
  the master, which the barrier makes equal for every worker. (Hosts' clocks must agree
  to a few ms, as NTP keeps them.)
- Exactness: a batch is reported only after the chief applied it, so a worker killed
  mid-round loses nothing: its closure is re-run on another worker (with that worker's
  next batch, into the same staging slot, overwriting any partial write) and its own
  batch, never applied nor reported, is re-issued from the applied offset. A checkpoint
  between rounds has nothing in flight: model and sharding state agree exactly.
- Closures cannot be pinned to workers: a round schedules one closure per worker and
  each idle worker takes one; when a worker is gone another one computes two batches.
- Not in BSP mode: tail work-stealing (a round never waits on a stolen remainder), and
  scaling while the job runs (the round size is the number of workers at start).

The model provides ``gradients(batch) -> (loss, ids, rows, dense)``, ``sparse_tables``
(name -> table updated row by row), ``dense_variables``, ``ids_per_record`` and
``learning_rate`` (see :class:`antdt_tf.models.deepfm.DeepFM`); ``applied`` (the audit
counter) if it has one. Staging costs, per worker slot, one copy of the dense variables
and ``max_batch_size * ids_per_record`` gradient rows per table — never a copy of the
tables themselves.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

import tensorflow as tf

from antdt_tf import errors
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.client import Task
from antdt_tf.tf.master_rpc import DEFAULT_TIMEOUT_MS, rpc_call, rpc_client
from antdt_tf.tf.pull import PullResult, WorkerCounters, pull_dataset

log = logging.getLogger(__name__)

# columns of the staged round info, one row per slot
RECORDS, LEASE, SHARD, EPOCH, APPLIED, LENGTH, WORKER, INCARNATION = range(8)


class SyncRoundTrainer(WorkerCounters):
    """Trains in BSP rounds (see the module docstring); the same interface as
    :class:`antdt_tf.tf.pull.PullTrainer` (``train()``, ``counters``, ``on_checkpoint``).

    Args:
      reporter: a ``ShardingClient`` the chief reports applied records with, on behalf
        of the workers (their task and incarnation travel with each staged batch).
      max_batch_size: the largest batch one worker may stage (default: the global batch,
        ``num_workers * batch_size``, the most ADJUST_BS ever gives one worker).
    """

    def __init__(self, strategy, coordinator, master: str, dataset: str, model,
                 batch_size: int, num_workers: int, progress_fn, reporter,
                 max_batch_size: int = 0, checkpoint_every_seconds: float = 0.0,
                 on_checkpoint=None, on_progress=None, progress_seconds: float = 1.0,
                 worker_slots: int = 0, timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.strategy, self.coordinator = strategy, coordinator
        self.master, self.dataset, self.model = master, dataset, model
        self.batch_size, self.num_workers = batch_size, num_workers
        self.progress_fn, self.reporter = progress_fn, reporter
        self.capacity = max_batch_size or num_workers * batch_size
        self.checkpoint_every_seconds = checkpoint_every_seconds
        self.on_checkpoint, self.on_progress = on_checkpoint, on_progress
        self.progress_seconds, self.timeout_ms = progress_seconds, timeout_ms
        self.rounds = 0
        self.refused_reports = 0
        # worker -> {batch size: batches}: what the rounds really trained (ADJUST_BS)
        self.batch_sizes_seen: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        rows = self.capacity * model.ids_per_record
        slots = max(num_workers, worker_slots)
        with strategy.scope():
            def staged(name, shape, dtype=tf.float32):
                return [tf.Variable(tf.zeros(shape, dtype), trainable=False,
                                    name=f"antdt_bsp_{name}_{k}") for k in range(num_workers)]

            self._ids = staged("ids", [rows], tf.int64)
            self._rows = {name: staged(f"rows_{name}", [rows] + table.shape[1:].as_list())
                          for name, table in model.sparse_tables.items()}
            self._dense = [staged(f"dense_{i}", v.shape.as_list(), v.dtype)
                           for i, v in enumerate(model.dense_variables)]
            self._record_ids = staged("record_ids", [self.capacity], tf.int64)
            self._info = tf.Variable(tf.zeros([num_workers, 8], tf.int64), trainable=False,
                                     name="antdt_bsp_info")
            self._refused = tf.Variable(tf.fill([slots], tf.constant(-1, tf.int64)),
                                        trainable=False, name="antdt_bsp_refused_lease")
            self._create_worker_counters(slots)
        self._stage = tf.function(self._stage_fn)
        self._apply = tf.function(self._apply_fn)

    # ------------------------------------------------------------ on the workers

    def _stage_fn(self, iterator, k: int, round_start):
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(),
                         tf.int64)
        rows_cap = self.capacity * self.model.ids_per_record
        optional = iterator.get_next_as_optional()

        def empty():
            return tf.zeros([8], tf.int64)

        def stage(batch):
            meta, ids = batch.pop("antdt"), batch.pop("record_id")
            n = tf.shape(ids, out_type=tf.int64)[0]
            _, flat, rows, dense = self.model.gradients(batch)
            check = tf.debugging.assert_less_equal(
                n, tf.constant(self.capacity, tf.int64),
                message=f"BSP: a batch is larger than max_batch_size={self.capacity}; "
                        "raise --max_batch_size or lower the batch sizes")
            with tf.control_dependencies([check]):
                pad = rows_cap - tf.shape(flat)[0]
                writes = [self._ids[k].assign(tf.pad(flat, [[0, pad]]))]
                for name, r in rows.items():
                    writes.append(self._rows[name][k].assign(
                        tf.pad(r, [[0, pad]] + [[0, 0]] * (len(r.shape) - 1))))
                for slots_of_var, g in zip(self._dense, dense):
                    writes.append(slots_of_var[k].assign(g))
                writes.append(self._record_ids[k].assign(
                    tf.pad(ids, [[0, self.capacity - n]])))
            with tf.control_dependencies(writes):
                micros = tf.cast(tf.maximum(tf.timestamp() - round_start, 0.0) * 1e6, tf.int64)
                incarnation = tf.reshape(meta["incarnation"], [])
                rpc_call(rpc_client(self.master, self.timeout_ms, "report"), "antdt.step",
                         [tf.constant(self.dataset), worker, incarnation, n, micros],
                         [tf.int64], self.timeout_ms)
                self._worker_last_step.scatter_update(tf.IndexedSlices(
                    tf.reshape(tf.timestamp(), [1]), tf.reshape(worker, [1])))
                return tf.stack([n, meta["lease"][0], meta["shard"][0],
                                 tf.cast(meta["epoch"][0], tf.int64),
                                 tf.reduce_max(meta["applied"]), meta["length"][0],
                                 worker, incarnation])

        def maybe_stage():
            batch = optional.get_value()
            n = tf.shape(batch["label"])[0]
            # empty: a WAIT marker; refused: the master no longer counts this lease as
            # this worker's (it expired): its records are trained elsewhere
            usable = tf.cond(n > 0, lambda: tf.not_equal(batch["antdt"]["lease"][0],
                                                         tf.gather(self._refused, worker)),
                             lambda: tf.constant(False))
            return tf.cond(usable, lambda: stage(dict(batch)), empty)

        row = tf.cond(optional.has_value(), maybe_stage, empty)
        self._info.scatter_update(tf.IndexedSlices(tf.reshape(row, [1, 8]), [k]))

    # ------------------------------------------------------------ on the chief

    def _apply_fn(self):
        info = self._info.read_value()
        records = info[:, RECORDS]
        weight = tf.cast(records, tf.float32) / tf.maximum(
            tf.cast(tf.reduce_sum(records), tf.float32), 1.0)
        lr = self.model.learning_rate
        total = [tf.zeros(v.shape, v.dtype) for v in self.model.dense_variables]
        applied = getattr(self.model, "applied", None)
        for k in range(self.num_workers):
            def apply_slot(k=k):
                ops = []
                for name, table in self.model.sparse_tables.items():
                    ops.append(table.scatter_sub(tf.IndexedSlices(
                        lr * weight[k] * self._rows[name][k].read_value(),
                        self._ids[k].read_value())))
                if applied is not None:
                    ids = self._record_ids[k].read_value()[:records[k]]
                    ops.append(applied.scatter_add(tf.IndexedSlices(
                        tf.ones_like(ids, tf.int32), ids)))
                with tf.control_dependencies(ops):
                    return tf.constant(True)

            tf.cond(records[k] > 0, apply_slot, lambda: tf.constant(False))
            total = [t + weight[k] * slots_of_var[k].read_value()
                     for t, slots_of_var in zip(total, self._dense)]
        for var, grad in zip(self.model.dense_variables, total):
            var.assign_sub(lr * grad)
        finished = tf.cast(tf.logical_and(records > 0,
                                          tf.equal(info[:, APPLIED], info[:, LENGTH])), tf.int64)
        self._worker_counts.scatter_add(tf.IndexedSlices(
            tf.stack([records, finished], 1), info[:, WORKER]))
        self._info.assign(tf.zeros_like(info))
        return info

    def _report(self, info) -> None:
        """Tells the master what the round applied, per worker and lease."""
        furthest = defaultdict(int)
        for row in info:
            if row[RECORDS] > 0:
                self.batch_sizes_seen[int(row[WORKER])][int(row[RECORDS])] += 1
                key = tuple(int(row[c]) for c in (WORKER, INCARNATION, LEASE, SHARD, EPOCH,
                                                  LENGTH))
                furthest[key] = max(furthest[key], int(row[APPLIED]))
        for (worker, incarnation, lease, shard, epoch, length), n in furthest.items():
            leased = pb.Shard(dataset=self.dataset, lease_id=lease, shard_id=shard,
                              epoch=epoch, length=length)
            task = Task("worker", worker, incarnation)
            try:
                if n == length:
                    self.reporter.report_done(leased, task)
                else:
                    self.reporter.report_progress(leased, n, task)
            except (errors.LeaseNotHeld, errors.StaleIncarnation) as e:
                # applied but no longer this worker's lease (expired during a long
                # round): the rest of it is skipped by that worker from now on
                self.refused_reports += 1
                log.warning("BSP report of worker %d lease %d refused: %s", worker, lease, e)
                self._refused.scatter_update(tf.IndexedSlices(
                    tf.constant([lease], tf.int64), tf.constant([worker], tf.int64)))

    def train(self) -> PullResult:
        master, dataset, batch_size = self.master, self.dataset, self.batch_size
        per_worker = self.coordinator.create_per_worker_dataset(
            lambda: pull_dataset(master, dataset, batch_size, wait_markers=True, wait_ms=0))
        iterator = iter(per_worker)
        t0 = last_ckpt = last_progress = time.monotonic()
        while not self.progress_fn().finished:
            start = tf.constant(time.time(), tf.float64)   # a tensor: no retrace per round
            for k in range(self.num_workers):
                self.coordinator.schedule(self._stage, args=(iterator, k, start))
            self.coordinator.join()          # the barrier: every slot staged (or empty)
            info = self._apply().numpy()
            self._report(info)
            if info[:, RECORDS].any():
                self.rounds += 1
            else:   # nothing free for anyone now (e.g. a dead worker's lease not back yet)
                time.sleep(0.1)
            now = time.monotonic()
            if self.on_progress is not None and now - last_progress >= self.progress_seconds:
                self.on_progress(*self.worker_counts())
                last_progress = now
            if (self.on_checkpoint is not None and self.checkpoint_every_seconds
                    and now - last_ckpt >= self.checkpoint_every_seconds):
                self.on_checkpoint()           # between rounds: nothing in flight
                last_ckpt = time.monotonic()
        return self._result(t0)
