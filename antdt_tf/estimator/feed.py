"""ShardFeed: one TF1 worker's data from the master, and the hooks that report it.

In TF1 between-graph replication (``MonitoredTrainingSession``, ``tf.estimator``) every
worker process builds its own graph and runs its own input pipeline. ShardFeed's input
is the TF2 path's :func:`antdt_tf.tf.pull.pull_dataset`: TF's RPC ops ask the master
for leases inside ``tf.data`` and TF ops read the records with the O(1) seek; only
lease descriptors cross the wire, never records. (``Dataset.from_generator`` is no
alternative in a distributed session: TF pins its ``PyFunc`` to ``/job:localhost``,
which no task of a cluster is — "Cannot assign a device for operation PyFunc".)

After each step, :class:`~antdt_tf.estimator.hooks.ShardReportHook` reports from
Python what the step trained — with sparse reports (the default) only when a lease is
finished or the master wants it per batch: every step also writes where its lease was
before the batch into a variable on the PS (``antdt_lease_record``, fetched in the same
``session.run`` as the train op), and the chief's
:class:`~antdt_tf.estimator.hooks.LeaseSettleHook` settles a dead or silent worker's
leases from there (the master holds them until then), so a failure still repeats at
most one batch. When the master refuses a report (the lease was taken
over by tail stealing, expired, or rolled back by a restore), the hook sets a variable
on the worker that the pipeline's last stage filters on: the next batch already skips
that lease. There is no read-ahead after that stage, so at most the one batch in
flight was trained after the lease stopped being this worker's (and the master counted
it: a steal settles one batch ahead).

The feed puts what the hooks need into graph collections (names in
:mod:`~antdt_tf.estimator.graph_keys`) and builds its hooks through
:mod:`~antdt_tf.estimator.assembly` (imported when asked: it imports TensorFlow); the
hooks module never imports this one.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Callable, Optional

from antdt_tf.estimator.graph_keys import META_FIELDS  # noqa: F401 (importable here, as before)
from antdt_tf.estimator.graph_keys import (LEASE_RECORD_VARIABLE, META_COLLECTION,
                                           RECORD_COLLECTION, REFUSED_LEASE_COLLECTION,
                                           VARIABLE_SCOPE, refused_lease_variable)
from antdt_tf.sharding.tf_rpc_client import TfRpcClient
# the SessionManager patch is a TF internal (imports no TF until called); importable from
# here and antdt_tf.estimator as before
from antdt_tf.tf.tf_internals import shorten_session_wait

log = logging.getLogger(__name__)


def _task_from_tf_config() -> tuple[str, int]:
    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    task = config.get("task", {})
    return task.get("type", ""), int(task.get("index", 0))


class ShardFeed:
    """Everything a TF1 worker adds to train from the master's shards::

        feed = ShardFeed(master="127.0.0.1:7000", dataset="train", batch_size=256)
        estimator.train(feed.input_fn, hooks=feed.hooks(),
                        saving_listeners=feed.saving_listeners())

    ``worker``: this worker's index in the master's worker numbering (default: from
    ``TF_CONFIG``: ``chief`` is worker 0 and ``worker:i`` is ``i + 1`` when the cluster
    has a chief job, else ``worker:i`` is ``i``). ``parse(batch) -> (features, labels)``
    turns a decoded batch (``label``, ``dense``, ``sparse``, ``record_id``) into what the
    model function takes (default: ``(batch without label, label)``).

    ``is_chief``: whether this worker writes checkpoints (default: worker 0).
    ``worker_device``: where the input pipeline's state lives (default: this task's
    device from ``TF_CONFIG``, else the device scope in effect; under
    ``replica_device_setter`` without ``TF_CONFIG`` pass it, e.g. ``/job:worker/task:1``,
    else the pipeline's variable would go to a PS).
    ``worker_wait_seconds``: how long a non-chief worker waits between checks for the
    chief's session (TF's ``SessionManager`` waits 30 s; there is no public knob, so the
    default of this process's ``SessionManager`` is lowered, to 0.1 s: each check is one
    ``report_uninitialized_variables`` on the PS, and at 0.5 s the workers of a job
    started up to 0.7 s apart; ``None`` leaves it alone).
    ``sparse_reports``: report a lease when it is finished (and per batch only where the
    master wants it), keeping each step's position in ``antdt_lease_record``, a
    variable created by :meth:`input_fn` under the device scope in effect — a PS under
    ``replica_device_setter`` / Estimator, where it survives the worker — with
    ``2 * worker_slots`` rows (worker indices must stay below ``worker_slots``).
    ``record_format``: how the dataset's files are read and decoded
    (:mod:`antdt_tf.tf.formats`: ``TFRecordExamples`` for ``tf.train.Example`` files, or
    one's own; default the compact ``.adtr`` format).
    ``prefetch_batches``: batches leased, read and decoded ahead of the step (0: none),
    so the next batch is ready when the step asks; a refused lease's batches are still
    dropped at the step (see :meth:`dataset_fn`).
    """

    def __init__(self, master: str, dataset: str, batch_size: int, worker: Optional[int] = None,
                 parse: Optional[Callable] = None, worker_wait_seconds: Optional[float] = 0.1,
                 is_chief: Optional[bool] = None, worker_device: Optional[str] = None,
                 sparse_reports: bool = True, worker_slots: int = 64,
                 prefetch_batches: int = 2, record_format=None):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if prefetch_batches < 0:
            raise ValueError(f"prefetch_batches must be >= 0, got {prefetch_batches}")
        job, index = _task_from_tf_config()
        if worker_device is None and job in ("chief", "worker"):
            worker_device = f"/job:{job}/task:{index}"
        if worker is None:
            if job == "chief":
                worker = 0
            elif job == "worker":
                has_chief = "chief" in json.loads(os.environ["TF_CONFIG"]).get("cluster", {})
                worker = index + 1 if has_chief else index
            else:
                raise ValueError("ShardFeed needs worker=<index> (or TF_CONFIG naming a chief "
                                 f"or worker task, got {job!r})")
        if sparse_reports and not 0 <= worker < worker_slots:
            raise ValueError(f"worker {worker} is outside the {worker_slots} worker slots of "
                             "the lease record: pass worker_slots > the largest worker index")
        self.master, self.dataset, self.batch_size = master, dataset, batch_size
        self.worker = worker
        self.sparse_reports, self.worker_slots = sparse_reports, worker_slots
        self.parse = parse
        self.record_format = record_format     # antdt_tf.tf.formats (default: .adtr)
        self.prefetch_batches = prefetch_batches
        self.client = TfRpcClient(master, dataset, worker)
        self.worker_device = worker_device
        self.refused_lease = None       # set by dataset_fn
        self.is_chief = worker == 0 if is_chief is None else is_chief
        self.state_saver = None         # the chief's ShardingStateSaver, once asked for
        if worker_wait_seconds is not None:
            shorten_session_wait(worker_wait_seconds)

    # ------------------------------------------------------------------ input

    def dataset_fn(self):
        """The ``tf.data.Dataset`` of this worker's batches: dicts of the decoded
        features, ``record_id`` and ``antdt`` (lease metadata for the report hook)."""
        import tensorflow as tf

        from antdt_tf.tf.pull import pull_dataset

        with tf.compat.v1.device(self.worker_device):
            # the lease whose report the master refused: its other batches are skipped
            self.refused_lease = tf.compat.v1.get_local_variable(
                refused_lease_variable(self.worker), initializer=tf.constant(-1, tf.int64),
                use_resource=True)
        # where the report hook finds it (it writes a refused lease there)
        tf.compat.v1.add_to_collection(REFUSED_LEASE_COLLECTION, self.refused_lease)
        ds = pull_dataset(self.master, self.dataset, self.batch_size, worker=self.worker,
                          sparse_reports=self.sparse_reports,
                          record_format=self.record_format)
        refused = self.refused_lease
        # leases, reads and decoding run ahead of the step (prefetch), the refusal check
        # does not: the filter reads the variable when the step takes its batch, so a
        # refusal reported after the step before skips every later batch of the lease,
        # prefetched or not. Nothing may read ahead *after* the filter: a batch
        # buffered there before a refusal would be trained twice (tf.data would inject a
        # prefetch at the end of the pipeline: turned off below)
        ds = ds.prefetch(self.prefetch_batches) if self.prefetch_batches else ds
        ds = ds.filter(lambda b: tf.not_equal(b["antdt"]["lease"][0], refused.read_value()))
        options = tf.data.Options()
        options.experimental_optimization.apply_default_optimizations = False
        options.experimental_optimization.inject_prefetch = False
        return ds.with_options(options)

    def input_fn(self, *args, **kwargs):
        """An Estimator ``input_fn`` (also callable directly in a TF1 graph): the next
        batch's ``(features, labels)`` tensors. The lease metadata goes to a graph
        collection, where :class:`ShardReportHook` finds it."""
        import tensorflow as tf

        iterator = tf.compat.v1.data.make_initializable_iterator(self.dataset_fn())
        # run by every session's default local init (Scaffold: tables_initializer)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS,
                                       iterator.initializer)
        batch = iterator.get_next()
        meta = batch.pop("antdt")
        n = tf.shape(meta["lease"], out_type=tf.int64)[0]
        # one int64 vector (META_FIELDS), fetched with every step: one fetch, not eight
        tf.compat.v1.add_to_collection(META_COLLECTION, tf.stack([tf.cast(t, tf.int64) for t in (
            meta["lease"][0], meta["shard"][0], meta["epoch"][0], meta["applied"][-1], n,
            meta["incarnation"], meta["sparse"][0], meta["length"][0])]))
        if self.sparse_reports:
            self._add_lease_record(meta, n)
        if self.parse is not None:
            return self.parse(batch)
        label = batch.pop("label")
        return batch, label

    def _add_lease_record(self, meta, n) -> None:
        """The PS variable of sparse reports and the op that writes this worker's row in
        every step: ``(incarnation, lease, applied before the batch)`` — a fact once the
        step runs, so it is written beside the step's updates, not after them."""
        import tensorflow as tf

        from antdt_tf.tf.accounting import lease_record_shape, lease_record_update

        graph = tf.compat.v1.get_default_graph()
        if graph.get_collection(RECORD_COLLECTION):
            return
        with tf.compat.v1.variable_scope(VARIABLE_SCOPE, reuse=tf.compat.v1.AUTO_REUSE):
            record = tf.compat.v1.get_variable(
                LEASE_RECORD_VARIABLE, shape=lease_record_shape(self.worker_slots), dtype=tf.int64,
                initializer=tf.compat.v1.constant_initializer(-1), trainable=False,
                use_resource=True)
        update = lease_record_update(record, self.worker, meta["incarnation"],
                                     meta["lease"][0], meta["applied"][-1] - n, n)
        graph.add_to_collection(RECORD_COLLECTION, record)
        graph.add_to_collection(RECORD_COLLECTION, update)

    # ------------------------------------------------------------------ hooks
    # (what each list holds and in which order: antdt_tf.estimator.assembly)

    def hooks(self) -> list:
        """Every worker's hooks: the report hook, and on the chief the hook that gives a
        restored checkpoint's sharding state back to the master and (sparse reports) the
        one that settles dead workers' leases from the PS record."""
        from antdt_tf.estimator.assembly import session_hooks

        return session_hooks(self.client, self.worker, self.dataset, self.sparse_reports,
                             self.state_saver_for_chief() if self.is_chief else None)

    @property
    def settle_hook(self):
        """The chief's ``LeaseSettleHook`` of the latest :meth:`hooks` (sparse reports),
        else ``None``."""
        return self.state_saver.settle_hook if self.state_saver is not None else None

    def state_saver_for_chief(self):
        """The chief's one ``ShardingStateSaver``: its checkpoint listener, and the owner
        of the chief's client of the master (its ``LeaseSettleHook`` uses it too)."""
        from antdt_tf.estimator.assembly import chief_saver

        if self.state_saver is None:
            self.state_saver = chief_saver(self.master, self.dataset)
        return self.state_saver

    def saving_listeners(self) -> list:
        """The chief's checkpoint listener: the sharding state goes into every checkpoint
        (``Estimator.train(saving_listeners=...)``; with ``MonitoredTrainingSession``
        use :meth:`chief_hooks`). Empty on other workers (they do not save)."""
        from antdt_tf.estimator.assembly import saving_listeners

        return saving_listeners(self.state_saver_for_chief() if self.is_chief else None)

    def chief_hooks(self, checkpoint_dir: str, save_secs: Optional[float] = None,
                    save_steps: Optional[int] = None) -> list:
        """For ``MonitoredTrainingSession(chief_only_hooks=..., checkpoint_dir=...,
        save_checkpoint_secs=None, save_checkpoint_steps=None)``: a checkpoint saver
        hook whose checkpoints carry the sharding state. With ``save_secs`` it is
        :class:`~antdt_tf.estimator.hooks.TimedCheckpointSaverHook` (TF's hook, without
        a ``global_step`` fetch from the PS in every step), with ``save_steps`` TF's
        ``CheckpointSaverHook``."""
        from antdt_tf.estimator.assembly import checkpoint_hooks

        return checkpoint_hooks(checkpoint_dir, self.state_saver_for_chief(),
                                save_secs=save_secs, save_steps=save_steps)

    def close(self) -> None:
        self.client.close()
