"""Workers pull their shards: a per-worker ``tf.data`` pipeline that asks the master.

Each worker's input pipeline talks to the master itself, with TensorFlow's RPC ops
(the master serves ``tensorflow.rpc.RpcService``; see ``antdt_tf.sharding.tf_rpc``):
it opens a new incarnation of task ``worker:<i>``, leases the next shard whenever it
needs records, and reads the shard with TF ops (a true seek, see ``reader``) in batches
of its own (a shard's last batch may be smaller; a batch that waited for the next lease
could wait forever at the end of the data, when that lease is its own remainder). Only
shard descriptors travel; records never pass through Python or the coordinator. A
worker that is fast simply asks more often, so it gets more shards.

Every batch carries, per record, the lease it came from and its position in the lease:
what a trainer needs to tell the master, after the step has applied the batch, how far
each lease got — exactly what the model has seen, up to the one batch in flight when a
worker dies (re-issued leases resume after the applied records, and a checkpoint taken
with no closure in flight holds model and sharding state that agree). The rules of that
accounting, sparse reports and the PS lease record included, are
:mod:`antdt_tf.tf.accounting`; the RPC client, :mod:`antdt_tf.tf.master_rpc`.

Every trainer pulls with it: :class:`PullTrainer` (custom loop over
``ClusterCoordinator``, many steps per closure, so the fixed cost per shard is one RPC),
the Keras path (``antdt_tf.tf.keras``), BSP rounds and the TF1 ``ShardFeed``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time

import tensorflow as tf
from antdt_tf.sharding.client import HeldLeaseKeeper
from antdt_tf.tf.accounting import (apply_lease_records, batch_counts, lease_record_shape,
                                    lease_record_update, report_due_tensor, run_step,
                                    send_report)
from antdt_tf.tf.master_rpc import (DEFAULT_TIMEOUT_MS, NEXT_TYPES, STATUS_END, STATUS_SHARD,
                                    STATUS_WAIT, rpc_call, rpc_client)


PIPELINE_KEYS = ("record_id", "antdt")   # what pull_dataset adds to every batch


def check_feature_names(features, whose: str) -> None:
    """Refuses features named like the pipeline's own entries (:data:`PIPELINE_KEYS`:
    the record ids and the lease position), which would overwrite them."""
    taken = sorted(set(PIPELINE_KEYS) & set(features))
    if taken:
        raise ValueError(f"{whose} features named {taken}: those names are the pipeline's "
                         "own (record ids and lease position); rename them")


def pull_dataset(master: str, dataset: str, batch_size: int, worker=None,
                 timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 wait_markers: bool = False, wait_ms: int = -1,
                 sparse_reports: bool = False, record_format=None) -> tf.data.Dataset:
    """The batches this worker trains, pulled shard by shard from the master.

    Call inside the ``dataset_fn`` of ``ClusterCoordinator.create_per_worker_dataset``
    (or a Keras ``DatasetCreator``): it runs on each worker. Elements are dicts of the
    decoded features (``label``, ``dense``, ``sparse``) plus ``record_id`` (global record
    index, for the audit) and ``antdt`` (what :func:`report_applied` needs: lease, shard, epoch, position). The dataset
    ends when the master says every epoch is done.

    ``wait_markers``: when the master has nothing for this worker now (WAIT, after its
    2 s long poll), yield one empty batch, so that a training loop can end its closure
    instead of blocking in ``get_next`` until more data comes. A chief that waits for
    its closures (to checkpoint) would otherwise wait for a worker that waits for data
    only another, unscheduled closure would train (seen: a checkpoint stalled until a
    lease expired; with static sharding, forever).

    ``wait_ms``: how long the master may hold a ``next`` call while nothing is free
    (-1: the master's long poll, 2 s). BSP rounds pass 0: a round must not wait 2 s
    for a worker that has nothing to do in it.

    ``sparse_reports``: the trainer records every batch's offset on the PS and can
    settle a lease from there (:class:`PullTrainer` with a ``record_fn``); the master
    then marks most leases ``sparse`` (``meta["sparse"]``): reported when finished and
    at the end of a closure instead of after every batch.

    ``record_format``: how the dataset's files are read and decoded
    (:mod:`antdt_tf.tf.formats`; default the compact ``.adtr`` format, whose batches
    have ``label``, ``dense`` and ``sparse``).
    """
    if record_format is None:
        from antdt_tf.tf.formats import COMPACT as record_format
    if worker is None:
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    worker = tf.cast(worker, tf.int64)
    name = tf.constant(dataset)
    client = rpc_client(master, timeout_ms, "pull")
    open_args = [name, worker] + ([tf.constant(1, tf.int64)] if sparse_reports else [])
    (incarnation,) = rpc_call(client, "antdt.open", open_args, [tf.int64], timeout_ms)

    def next_lease(i):
        # request id i + 1 (unique in this incarnation): a retried call gets the same lease
        args = [name, worker, incarnation, i + 1]
        if wait_ms >= 0:
            args.append(tf.constant(wait_ms, tf.int64))
        status, lease, shard, epoch, path, file_start, start, length, size, sparse = rpc_call(
            client, "antdt.next", args, NEXT_TYPES, timeout_ms)
        # ADJUST_BS: the Controller's batch size for this worker, from this lease on
        size = tf.where(size > 0, size, tf.constant(batch_size, tf.int64))
        return {"status": status, "lease": lease, "shard": shard, "epoch": epoch,
                "path": path, "file_start": file_start, "start": start, "length": length,
                "batch_size": size, "sparse": sparse}

    wanted = (STATUS_SHARD, STATUS_WAIT) if wait_markers else (STATUS_SHARD,)
    leases = (tf.data.Dataset.range(2 ** 62)          # sequential: one lease at a time
              .map(next_lease)
              # tf.not_equal, not `!=`: tf.estimator's graphs run with Tensor equality
              # off, where `!=` compares identities and the dataset would never end
              .take_while(lambda d: tf.not_equal(d["status"], STATUS_END))
              .filter(lambda d: tf.reduce_any(tf.equal(d["status"], wanted))))

    def shard_batches(d):
        # Batches never span shards: a partial batch waiting for the next lease could
        # wait forever when that lease is its own shard's remainder (end of the data).
        # Each lease's datasets are built anew, so they hold no function: decoding is
        # one map *after* flat_map (a map inside instantiates its function for every
        # lease), and a batch's offsets come from its index, not from
        # range(length).batch(), which collects them one element at a time: ≈ 0.3 ms
        # of worker CPU per batch of 256, measured — half of what reading and decoding
        # the batch costs.
        raw = record_format.read(d["path"], d["file_start"], d["length"], d["batch_size"])
        index = tf.data.Dataset.range((d["length"] + d["batch_size"] - 1) // d["batch_size"])
        lease = tf.data.Dataset.from_tensors(d).repeat()
        batches = tf.data.Dataset.zip((raw, index, lease))
        if wait_markers:   # a WAIT (length 0, nothing read): one empty batch
            marker = tf.data.Dataset.from_tensors(
                (tf.zeros([0], tf.string), tf.constant(0, tf.int64), d)).take(
                tf.cast(tf.equal(d["status"], STATUS_WAIT), tf.int64))
            batches = batches.concatenate(marker)
        return batches

    def to_batch(raw, index, d):
        batch = dict(record_format.decode(raw))
        check_feature_names(batch, "the record format decodes to")
        n = tf.shape(raw, out_type=tf.int64)[0]
        offset = index * d["batch_size"] + tf.range(n)
        batch["record_id"] = d["start"] + offset
        batch["antdt"] = {"lease": tf.fill([n], d["lease"]), "shard": tf.fill([n], d["shard"]),
                          "epoch": tf.fill([n], d["epoch"]), "applied": offset + 1,
                          "length": tf.fill([n], d["length"]), "sparse": tf.fill([n], d["sparse"]),
                          "worker": worker,
                          "incarnation": incarnation}
        return batch

    return leases.flat_map(shard_batches).map(to_batch)


def no_records(spec):
    """A batch of ``spec``'s structure without records: what a closure loop trains on
    (nothing) when its iterator is exhausted, so one ``tf.cond`` can guard the step."""
    return tf.nest.map_structure(
        lambda t: tf.zeros([0 if d is None else d for d in t.shape], t.dtype), spec)


@dataclasses.dataclass
class PullResult:
    records: int
    shards: int
    seconds: float
    shards_per_worker: list[int]
    records_per_worker: list[int]
    last_step_unix: list[float] = dataclasses.field(default_factory=list)


class WorkerCounters:
    """Per-worker counters on the PS that a trainer's steps update and its report reads:
    [records trained, shards finished] and when each worker finished its latest step
    (its clock: busy time per worker). Sized for every worker slot the job may scale to,
    so a checkpoint restores into a chief with more or fewer workers."""

    def _create_worker_counters(self, slots: int) -> None:
        # one PS update per step (per closure would lose a killed closure's steps)
        self._worker_counts = tf.Variable(tf.zeros([slots, 2], tf.int64),
                                          trainable=False, name="antdt_worker_counts")
        self._worker_last_step = tf.Variable(tf.zeros([slots], tf.float64),
                                             trainable=False, name="antdt_worker_last_step")
        self.counters = tf.train.Checkpoint(worker_counts=self._worker_counts)

    def worker_counts(self) -> tuple[list[int], list[int]]:
        """(shards, records) per worker slot."""
        counts = self._worker_counts.numpy()
        return counts[:, 1].tolist(), counts[:, 0].tolist()

    def _result(self, t0: float) -> PullResult:
        """The final progress callback and the result, from the master's count."""
        shards, records = self.worker_counts()
        if self.on_progress is not None:
            self.on_progress(shards, records)
        p = self.progress_fn()
        return PullResult(int(p.records_done_total), int(sum(shards)),
                          time.monotonic() - t0, shards, records,
                          self._worker_last_step.numpy().tolist())


class PullTrainer(WorkerCounters):
    """Custom training loop over ``ClusterCoordinator`` with worker-side pulling.

    Schedules closures of up to ``steps_per_closure`` steps on every worker's pulled
    dataset, keeping ``in_flight_per_worker`` closures per worker queued, until the
    master reports the dataset finished. Every ``checkpoint_every_seconds`` (or
    ``checkpoint_every_steps``) it drains the closures in flight — every pulled batch is
    then trained *and* reported — and calls ``on_checkpoint()``.

    ``step_fn(batch, record_ids)`` runs in replica context on the worker and applies the
    gradients itself (e.g. ``DeepFM.train_step``).

    ``record_fn`` (``ShardingClient.apply_lease_record``): sparse reports. Each step
    then also records on the PS, beside its gradients, how far its worker's lease got
    before the step's batch (``(incarnation, lease, applied)``), and a lease the master
    marked sparse is reported to it only when it is finished and at the end of a
    closure (≈ one RPC per lease instead of one per batch: that RPC was ≈ 20 % of a
    step's CPU, ``make bench-step-cost``). Exactness is kept by the record: when a
    holder dies, the master holds its sparse leases until this trainer settles them
    from the record (``DatasetProgress.held``; at most the batch in flight or the one
    just applied is trained again), and before each checkpoint it brings the master's
    counts up to the records. Without ``record_fn`` every batch is reported.
    """

    def __init__(self, strategy, coordinator, master: str, dataset: str, step_fn,
                 batch_size: int, num_workers: int, progress_fn,
                 steps_per_closure: int = 16, in_flight_per_worker: int = 2,
                 checkpoint_every_seconds: float = 0.0, on_checkpoint=None,
                 on_progress=None, progress_seconds: float = 1.0, worker_slots: int = 0,
                 record_fn=None, record_format=None):
        """``record_format``: how the workers read and decode the dataset's files
        (:mod:`antdt_tf.tf.formats`; default the compact ``.adtr`` format)."""
        self.strategy = strategy
        self.coordinator = coordinator
        self.master = master
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.progress_fn = progress_fn       # () -> DatasetProgress (from the master)
        self.steps_per_closure = steps_per_closure
        self.window = max(1, in_flight_per_worker * num_workers)
        self.checkpoint_every_seconds = checkpoint_every_seconds
        self.on_checkpoint = on_checkpoint
        self.on_progress = on_progress
        self.progress_seconds = progress_seconds
        self.record_fn = record_fn
        self.record_format = record_format
        self._step_fn = step_fn
        slots = max(num_workers, worker_slots)
        with strategy.scope():
            self._create_worker_counters(slots)
            # per worker: a lease the master refused a report for (its rest was taken
            # over by tail stealing, or it expired): its further batches are skipped
            self._refused_lease = tf.Variable(tf.fill([slots], tf.constant(-1, tf.int64)),
                                              trainable=False, name="antdt_refused_lease")
            if record_fn is not None:
                # sparse reports: each worker's latest step (lease_record_update).
                # Not checkpointed: a restore re-issues every lease anyway.
                self._lease_record = tf.Variable(
                    tf.fill(lease_record_shape(slots), tf.constant(-1, tf.int64)),
                    trainable=False, name="antdt_lease_record")
        self._train = tf.function(self._train_fn)

    def _train_fn(self, iterator):
        # the worker index is resolved per worker at the top level of the function (it
        # is a placeholder TF feeds per worker; nested in the loop it is not fed)
        worker = tf.reshape(tf.cast(
            tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64), [1])
        sparse = self.record_fn is not None
        spec = iterator.element_spec
        # the last trained batch whose position the master has not heard yet:
        # lease (-1: none), shard, epoch, applied (of the lease)
        nothing = tf.constant([-1, 0, 0, 0], tf.int64)

        def report(last, ident, micros, steps):
            return send_report(self.master, self.dataset, ident[0], ident[1], last[0:1],
                               last[1:2], last[2:3], last[3:4], micros, tf.maximum(steps, 1))

        def replica_fn(batch, worker):
            meta = batch.pop("antdt")
            ids = batch.pop("record_id")
            # The counters are bookkeeping (progress, the per-worker split), not the data
            # accounting, which is the master's: updated beside the step, not after the
            # report, so that the PS does not hold the step open for the master's answer
            # (measured: ≈ 1 ms of PS CPU per step). A batch cut off by a kill may count.
            self._worker_counts.scatter_add(tf.IndexedSlices(
                tf.reshape(batch_counts(meta), [1, 2]), worker))
            self._step_fn(batch, ids)
            if sparse:
                # The record says where the lease was *before* this batch: a fact once
                # this step runs (the previous step and its report are complete), so it
                # is written beside the step, not after it. A kill repeats at most the
                # batch in flight or the one just applied: one batch.
                n = tf.shape(meta["lease"], out_type=tf.int64)[0]
                lease_record_update(self._lease_record, meta["worker"], meta["incarnation"],
                                    tf.reduce_max(meta["lease"]),
                                    tf.reduce_max(meta["applied"]) - n, n)

        def fetch(refused):
            """The next batch, and whether to train it: a batch without records (the end,
            or a WAIT marker: the master has nothing for this worker now) ends the
            closure, and so does a batch of a refused lease (not ours any more: another
            worker trains its records), which is dropped here — the next closure goes on
            after it."""
            batch = iterator.get_next_as_optional()
            value = tf.cond(batch.has_value(), batch.get_value, lambda: no_records(spec))
            lease = tf.reduce_max(value["antdt"]["lease"])   # batches never span leases
            return value, tf.logical_and(tf.shape(value["label"])[0] > 0,
                                         tf.not_equal(lease, refused))

        # The step is guarded by the loop's own predicate, not by a tf.cond: the function
        # runs partitioned over the worker and the PS, and every predicate that guards PS
        # ops is one more tensor the PS receives per step (one tf.cond around the step:
        # ≈ 5 % of the job's time, measured; AutoGraph's break/continue nest one cond per
        # statement: ≈ 10 % more CPU). So each iteration trains the batch the previous
        # one fetched, reports it if due, and only then fetches the next: the next step
        # waits for the report (and the refusal it may bring), so a holder is never more
        # than one batch past its last report or record.
        def body(i, train, value, refused, last, micros, steps, ident):
            meta = value["antdt"]
            with tf.control_dependencies([train]):   # the batch is here: the step's own time
                start = tf.timestamp()
            _, effects = run_step(lambda: self.strategy.run(replica_fn, args=(value, worker)))
            with tf.control_dependencies(effects):   # every update of the step has landed
                micros += (tf.timestamp() - start) * 1e6
            steps += 1
            lease = tf.reduce_max(meta["lease"])
            applied = tf.reduce_max(meta["applied"])
            due = report_due_tensor(sparse, tf.reduce_max(meta["sparse"]), applied,
                                    tf.reduce_max(meta["length"]))
            this = tf.stack([lease, tf.reduce_max(meta["shard"]),
                             tf.cast(tf.reduce_max(meta["epoch"]), tf.int64), applied])
            ident = tf.stack([meta["worker"], meta["incarnation"]])
            rejected = tf.cond(due, lambda: report(this, ident, micros, steps),
                               lambda: tf.constant(0, tf.int64))
            refused = tf.where(rejected > 0, lease, refused)
            last = tf.where(due, nothing, this)
            micros = tf.where(due, tf.constant(0.0, tf.float64), micros)
            steps = tf.where(due, tf.constant(0, tf.int64), steps)
            with tf.control_dependencies([rejected]):   # the next batch after the report
                value, train = tf.cond(
                    i + 1 < self.steps_per_closure, lambda: fetch(refused),
                    lambda: (no_records(spec), tf.constant(False)))   # (none taken)
            return i + 1, train, value, refused, last, micros, steps, ident

        refused = tf.reshape(tf.gather(self._refused_lease, worker), [])
        value, train = fetch(refused)
        stepped, _, _, refused, last, micros, steps, ident = tf.while_loop(
            lambda i, train, *_: train, body,
            [tf.constant(0), train, value, refused, nothing, tf.constant(0.0, tf.float64),
             tf.constant(0, tf.int64), tf.constant([-1, -1], tf.int64)])

        # the end of the closure: the last batch's report (with sparse reports: where the
        # lease got, one RPC per closure)
        def closure_end():
            r = report(last, ident, micros, steps)
            return tf.where(r > 0, last[0], refused)
        refused = tf.cond(last[0] >= 0, closure_end, lambda: refused)
        self._refused_lease.scatter_update(tf.IndexedSlices(tf.reshape(refused, [1]), worker))
        if stepped > 0:   # when this worker finished a step last (its clock): busy time
            self._worker_last_step.scatter_update(tf.IndexedSlices(
                tf.reshape(tf.timestamp(), [1]), worker))
        # no return value: fetching remote tensors from several threads crashed TF

    def _apply_records(self, held=(), drained: bool = False) -> None:
        """Sparse reports: brings the master up to the records on the PS and settles
        ``held`` leases (:func:`apply_lease_records`)."""
        apply_lease_records(self.record_fn, self.dataset, self._lease_record.numpy(), held,
                            drained=drained)

    def train(self) -> PullResult:
        master, dataset, batch_size = self.master, self.dataset, self.batch_size
        sparse, record_format = self.record_fn is not None, self.record_format
        per_worker = self.coordinator.create_per_worker_dataset(
            lambda: pull_dataset(master, dataset, batch_size, wait_markers=True,
                                 sparse_reports=sparse, record_format=record_format))
        iterator = iter(per_worker)
        slots = threading.Semaphore(self.window)
        errors: list[BaseException] = []
        t0 = last_ckpt = last_progress = time.monotonic()

        def settle(remote):
            try:
                remote.fetch()       # waits for the closure; raises what it raised
            except BaseException as e:  # surfaced by train()
                errors.append(e)
            finally:
                slots.release()

        def drain():
            for _ in range(self.window):
                slots.acquire()
            for _ in range(self.window):
                slots.release()

        # the master keeps dead workers' sparse leases for this loop however long it
        # waits (a drain before a checkpoint while TF recovers a worker can take longer
        # than the master's --settle_seconds)
        keeper = HeldLeaseKeeper(master, [dataset]).start() if sparse else None
        try:
            with concurrent.futures.ThreadPoolExecutor(self.window, "antdt-pull") as pool:
                while not errors:
                    now = time.monotonic()
                    if (self.on_progress is not None
                            and now - last_progress >= self.progress_seconds):
                        self.on_progress(*self.worker_counts())
                        last_progress = now
                    if (self.on_checkpoint is not None and self.checkpoint_every_seconds
                            and now - last_ckpt >= self.checkpoint_every_seconds):
                        drain()
                        if not errors:
                            if sparse:   # no step runs now: the records are final
                                self._apply_records(self.progress_fn().held, drained=True)
                            self.on_checkpoint()
                        last_ckpt = time.monotonic()
                    progress = self.progress_fn()
                    if sparse and progress.held:
                        self._apply_records(progress.held)
                    if progress.finished:
                        break
                    # wait for a free slot, but not longer than the progress period: the
                    # reports carry the PS probes, and the Monitor needs them regularly also
                    # when every closure is slow (a slow PS slows them all)
                    if not slots.acquire(timeout=self.progress_seconds):
                        continue
                    pool.submit(settle, self.coordinator.schedule(self._train, args=(iterator,)))
            self.coordinator.join()
        finally:
            if keeper is not None:
                keeper.stop()
        if errors:
            raise errors[0]
        return self._result(t0)
