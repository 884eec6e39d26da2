"""ShardTrainer: a custom training loop over ``ClusterCoordinator`` fed by the master.

The coordinator (chief) pulls shard *descriptors* from the master and schedules one
closure per shard; the closure reads the shard's records on the worker with TF ops
(:mod:`antdt_tf.tf.reader`) and trains on them. A worker that finishes early simply gets
the next closure, so fast workers train more shards than slow ones. A shard is reported
DONE to the master only after its closure finished on a worker.

Exactly once, up to one batch per failure: when a worker dies mid-shard,
``ClusterCoordinator`` re-runs the closure on another worker (at-least-once). Every
closure runs in a *slot*; two small variables on the PS hold, per slot, the lease it
runs and how many of its records were applied, updated right after every step. A re-run
finds its lease there and resumes after the applied records, so only a batch whose
step ran but whose progress update did not can be applied twice. The audit mode
counts per record how often its gradient was applied (a counter on the PS, updated in
the same step), so this is measured, not guessed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time

import tensorflow as tf

from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.client import ShardingClient, Task
from antdt_tf.tf.reader import decode_records, raw_shard_dataset

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainResult:
    shards: int
    records: int
    seconds: float
    shards_per_worker: list[int] = dataclasses.field(default_factory=list)
    records_per_worker: list[int] = dataclasses.field(default_factory=list)


class ShardTrainer:
    """Trains ``step_fn`` on every shard of ``dataset`` the master hands out.

    Args:
      strategy / coordinator: a ``ParameterServerStrategy`` and its ``ClusterCoordinator``.
      client: a :class:`ShardingClient` of the job's master.
      dataset: the registered dataset name; its shards carry the record file path
        (``Shard.file``) or use ``path`` for a ``num_records`` dataset.
      step_fn: ``step_fn(batch, record_ids) -> loss``, called in replica context on the
        worker for every batch (it applies the gradients itself).
      num_workers: worker tasks in the cluster (sizes the window of scheduled closures).
      in_flight_per_worker: closures scheduled ahead per worker (keeps workers busy while
        the coordinator reports and fetches).
      checkpoint_every_shards / on_checkpoint: every that many DONE shards, drain the
        closures in flight and call ``on_checkpoint()`` at that shard boundary.
      on_progress / progress_seconds: ``on_progress(shards_per_worker, records_per_worker)``
        from the scheduling thread about every ``progress_seconds`` (numbers measured on the
        workers, read from the PS).

    ``counters`` (trackable) holds the per-worker numbers; checkpoint it with the model so
    a relaunched coordinator continues counting.
    """

    def __init__(self, strategy, coordinator, client: ShardingClient, dataset: str, step_fn,
                 batch_size: int, num_workers: int, path: str = "",
                 in_flight_per_worker: int = 2, task: Task = Task("chief", 0),
                 checkpoint_every_shards: int = 0, on_checkpoint=None, on_progress=None,
                 progress_seconds: float = 1.0):
        self.strategy = strategy
        self.coordinator = coordinator
        self.client = client
        self.dataset = dataset
        self.path = path
        self.batch_size = batch_size
        self.task = task
        self.window = max(1, in_flight_per_worker * num_workers)
        self._step_fn = step_fn
        self.checkpoint_every_shards = checkpoint_every_shards
        self.on_checkpoint = on_checkpoint
        self.on_progress = on_progress
        self.progress_seconds = progress_seconds
        with strategy.scope():
            # Per scheduling slot: the lease it runs and how many of its records were
            # applied. On the PS, so a closure re-run on another worker can resume.
            self._slot_lease = tf.Variable(tf.fill([self.window], tf.constant(-1, tf.int64)),
                                           trainable=False, name="antdt_slot_lease")
            self._slot_applied = tf.Variable(tf.zeros([self.window], tf.int64),
                                             trainable=False, name="antdt_slot_applied")
            # Shards and records each worker finished: the dynamic split, measured.
            self._worker_shards = tf.Variable(tf.zeros([num_workers], tf.int64),
                                              trainable=False, name="antdt_worker_shards")
            self._worker_records = tf.Variable(tf.zeros([num_workers], tf.int64),
                                               trainable=False, name="antdt_worker_records")
        self.counters = tf.train.Checkpoint(worker_shards=self._worker_shards,
                                            worker_records=self._worker_records)
        self._train_shard = tf.function(self._train_shard_fn)

    def worker_counts(self) -> tuple[list[int], list[int]]:
        """(shards, records) trained by each worker so far."""
        return self._worker_shards.numpy().tolist(), self._worker_records.numpy().tolist()

    def _train_shard_fn(self, path, file_start, global_start, length, slot, lease_id):
        def replica_fn(path, file_start, global_start, length, slot, lease_id):
            # A re-run of this closure (its worker died) resumes after the batches that
            # were already applied: the slot remembers them, updated with every step.
            slot_idx = tf.reshape(slot, [1])
            resumed = tf.gather(self._slot_lease, slot_idx)[0] == lease_id
            skip = tf.where(resumed, tf.gather(self._slot_applied, slot_idx)[0],
                            tf.constant(0, tf.int64))
            self._slot_lease.scatter_update(tf.IndexedSlices(tf.reshape(lease_id, [1]), slot_idx))
            self._slot_applied.scatter_update(tf.IndexedSlices(tf.reshape(skip, [1]), slot_idx))
            offset = skip
            # iter + get_next_as_optional, not `for batch in ds` (autograph's dataset loop
            # costs several times more per shard), and decoding here, not in a map stage
            batches = iter(raw_shard_dataset(path, file_start + skip, length - skip,
                                             self.batch_size))
            raw = batches.get_next_as_optional()
            while raw.has_value():
                batch = decode_records(raw.get_value())
                n = tf.shape(batch["label"], out_type=tf.int64)[0]
                ids = global_start + offset + tf.range(n, dtype=tf.int64)
                self._step_fn(batch, ids)
                offset += n
                self._slot_applied.scatter_update(tf.IndexedSlices(tf.reshape(offset, [1]),
                                                                   slot_idx))
                raw = batches.get_next_as_optional()
            tf.debugging.assert_equal(offset, length, message="the shard has fewer records "
                                      "than registered (file shorter than its record count?)")
            worker = tf.reshape(tf.cast(
                tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64), [1])
            self._worker_shards.scatter_add(tf.IndexedSlices(tf.ones([1], tf.int64), worker))
            self._worker_records.scatter_add(tf.IndexedSlices(tf.reshape(length - skip, [1]),
                                                              worker))
            # No return value: fetching a remote tensor from several threads at once
            # crashed the coordinator (SIGSEGV in ClusterCoordinator's copy to local).
        self.strategy.run(replica_fn, args=(path, file_start, global_start, length, slot,
                                            lease_id))

    def train(self) -> TrainResult:
        """Pulls and trains until the master says END. Returns what was trained."""
        free_slots = list(range(self.window))
        slots = threading.Semaphore(self.window)
        done = {"shards": 0, "records": 0}
        lock = threading.Lock()
        errors: list[BaseException] = []
        t0 = time.monotonic()

        def settle(shard: pb.Shard, remote, slot: int):
            try:
                remote.fetch()   # waits for the closure; raises what it raised
                trained = shard.length
                self.client.report_done(shard, task=self.task)
                with lock:
                    done["shards"] += 1
                    done["records"] += trained
            except BaseException as e:  # surfaced by train()
                errors.append(e)
            finally:
                with lock:
                    free_slots.append(slot)
                slots.release()

        last_checkpoint = 0

        def at_shard_boundary():
            """Drains the closures in flight, so the model holds exactly the DONE shards,
            then checkpoints (model and sharding state agree)."""
            for _ in range(self.window):
                slots.acquire()
            try:
                if not errors:
                    self.on_checkpoint()
            finally:
                for _ in range(self.window):
                    slots.release()

        last_progress = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(self.window, "antdt-settle") as pool:
            while not errors:
                if (self.on_progress is not None and
                        time.monotonic() - last_progress >= self.progress_seconds):
                    self.on_progress(*self.worker_counts())
                    last_progress = time.monotonic()
                if (self.on_checkpoint is not None and self.checkpoint_every_shards and
                        done["shards"] - last_checkpoint >= self.checkpoint_every_shards):
                    at_shard_boundary()
                    last_checkpoint = done["shards"]
                slots.acquire()
                resp = self.client.get_shard(self.dataset, task=self.task)
                if resp.status == pb.GetShardResponse.END:
                    slots.release()
                    break
                if resp.status == pb.GetShardResponse.WAIT:
                    slots.release()
                    time.sleep(resp.retry_after_seconds)
                    continue
                s = resp.shard
                with lock:
                    slot = free_slots.pop()
                remote = self.coordinator.schedule(self._train_shard, args=(
                    tf.constant(s.file or self.path), tf.constant(s.file_start, tf.int64),
                    tf.constant(s.start, tf.int64), tf.constant(s.length, tf.int64),
                    tf.constant(slot, tf.int64), tf.constant(s.lease_id, tf.int64)))
                pool.submit(settle, s, remote, slot)
        self.coordinator.join()
        if errors:
            raise errors[0]
        shards, records = self.worker_counts()
        if self.on_progress is not None:
            self.on_progress(shards, records)
        return TrainResult(done["shards"], done["records"], time.monotonic() - t0,
                           shards, records)
