"""``model.fit`` under ParameterServerStrategy, fed by the master (tf-keras).

Keras 3 has no ParameterServerStrategy support, so this needs tf-keras 2.21 and
``TF_USE_LEGACY_KERAS=1`` set before TensorFlow is imported. Three pieces (the whole
recipe for one's own model and data: docs/keras.md)::

    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf
    from antdt_tf.tf import keras as antdt_keras

    with strategy.scope():
        model = build_your_model()          # inputs: a dict of the decoded features
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss=...)
    sharding = antdt_keras.ShardingCallback(master, "train", checkpoint_dir=ckpt_dir)
    model = sharding.attach(model)          # wraps model.train_step (yours too)
    sharding.restore_or_initialize(model)   # model, optimizer and sharding state
    model.fit(antdt_keras.dataset_creator(master, "train", batch_size=256, parse=...),
              epochs=1, steps_per_epoch=sharding.steps_upper_bound(256),
              callbacks=[sharding])

- :func:`dataset_creator`: each worker's pipeline pulls shards from the master
  (:func:`antdt_tf.tf.pull.pull_dataset`) and yields ``(features, label, sample_weight)``.
  ``model.fit`` under PSS needs an endless dataset (a finite one ends ``fit`` with
  ``CancelledError``, measured), so after the last shard it yields one-record padding
  batches with sample weight 0 — a no-op for SGD and Adagrad (momentum and Adam still
  move the weights a little on such steps).
- :class:`ShardingCallback`: its ``attach`` wraps the model's ``train_step`` so that the
  worker tells the master how far its lease got (the same exactness as the custom loop: at most one
  batch per failure applied twice or lost), stops ``fit`` when the master says every
  epoch is done, and checkpoints model, optimizer and sharding state together at step
  boundaries (it drains the scheduled steps first).

Sparse reports (``sparse_reports=True`` on both, as the custom loop does by default):
each step writes how far its lease got into a PS variable beside its gradients
(:func:`~antdt_tf.tf.accounting.lease_record_update`) and reports a lease only when it is
finished or the master wants it per batch (an epoch's tail, slow holders); the callback,
on the chief, settles the leases of dead or silent workers from that record
(:func:`~antdt_tf.tf.accounting.apply_lease_records`) about every second and before every
checkpoint. So that it can, a worker's step never waits for data longer than the
master's long poll: when the master has nothing for it now, the step trains a padding
batch (sample weight 0) instead of blocking in ``get_next`` — the chief's main thread,
which paces the scheduled steps, would otherwise wait on a step that waits for the one
lease only the settle can give back.
"""

from __future__ import annotations

import collections
import logging
import time

import tensorflow as tf
import tf_keras as keras   # the [tf] extra installs it; TF_USE_LEGACY_KERAS=1 makes it tf.keras

from antdt_tf.sharding.client import HeldLeaseKeeper
from antdt_tf.tf import tf_internals
from antdt_tf.tf.tf_internals import accept_remote_logs
from antdt_tf.tf.accounting import (apply_lease_records, lease_record_shape, lease_record_update,
                                    report_applied, report_due_tensor, run_step)
from antdt_tf.tf.master_rpc import DEFAULT_TIMEOUT_MS
from antdt_tf.tf.pull import check_feature_names, pull_dataset

log = logging.getLogger(__name__)


def default_parse(batch: dict):
    """The compact format's batch as the model's ``(features, label)``: the features
    ``dense`` (f32[n,13]) and ``sparse`` (i64[n,26]), the label f32[n] (0 or 1)."""
    return {"dense": batch["dense"], "sparse": batch["sparse"]}, batch["label"]


def _padding_like(spec, worker):
    """One record of ``spec``'s structure, with sample weight 0 and no lease: trains
    nothing (the batch ``model.fit`` needs once the data is done, and a WAIT's)."""
    def zeros(s):
        if not isinstance(s, tf.TensorSpec):
            raise TypeError(f"a padding batch needs dense features, got a {type(s).__name__}: "
                            "make the parse function return dense tensors (e.g. "
                            "tf.sparse.to_dense)")
        return tf.zeros([1 if d is None else d for d in s.shape.as_list()], s.dtype)
    x, y, w = tf.nest.map_structure(zeros, spec)
    x = dict(x)
    x["record_id"] = tf.fill([1], tf.constant(-1, tf.int64))
    meta = dict(x["antdt"], worker=worker, incarnation=tf.constant(-1, tf.int64))
    meta["lease"] = tf.fill([1], tf.constant(-1, tf.int64))
    x["antdt"] = meta
    return x, y, tf.zeros_like(w)


def dataset_creator(master: str, dataset: str, batch_size: int,
                    timeout_ms: int = DEFAULT_TIMEOUT_MS, sparse_reports: bool = False,
                    steps_per_execution: int = 1, parse=None, record_format=None):
    """A Keras ``DatasetCreator`` whose per-worker pipelines pull from the master.

    ``record_format`` reads and decodes the dataset's files (:mod:`antdt_tf.tf.formats`:
    the compact ``.adtr`` format by default, ``TFRecordExamples`` for ``tf.train.Example``
    files, or one's own). ``parse(batch) -> (features, label)`` or
    ``(features, label, sample_weight)`` turns a decoded batch (a dict) into what the
    model takes; ``features`` must be a dict (default: :func:`default_parse`). The
    pipeline then adds two entries to the features, ``record_id`` and ``antdt`` (the
    lease position), which the step of :meth:`ShardingCallback.attach` removes before
    the model's own ``train_step`` sees the batch.

    ``sparse_reports`` must match the :class:`ShardingCallback`'s, and
    ``steps_per_execution`` the model's (``compile``): with sparse reports a step for
    which the master has nothing now trains a padding batch after the master's long
    poll, and a closure runs ``steps_per_execution`` steps, so each poll is cut to
    2 s / ``steps_per_execution`` — a closure of nothing but waits ends within ~2 s
    instead of holding its worker (and the chief's pacing) 2 s per step (seen at 16:
    32 s, while another worker sat on the last lease it had read ahead)."""
    if steps_per_execution < 1:
        raise ValueError(f"steps_per_execution must be >= 1, got {steps_per_execution}")
    wait_ms = -1 if steps_per_execution == 1 else max(50, 2000 // steps_per_execution)
    parse = default_parse if parse is None else parse

    def to_keras(b):
        b = dict(b)
        meta, ids = b.pop("antdt"), b.pop("record_id")
        x, y, w = keras.utils.unpack_x_y_sample_weight(parse(b))
        if not isinstance(x, dict):
            raise TypeError("parse must return the features as a dict (the pipeline adds "
                            f"'record_id' and 'antdt' to it), got {type(x).__name__}")
        check_feature_names(x, "parse returned")
        x = dict(x, record_id=ids, antdt=meta)
        ones = tf.ones(tf.shape(ids), tf.float32)
        return x, y, ones if w is None else tf.cast(w, tf.float32) * ones

    def dataset_fn(input_context):
        del input_context   # shards come from the master, not from a static split
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(),
                         tf.int64)
        pulled = pull_dataset(master, dataset, batch_size, timeout_ms=timeout_ms,
                              wait_markers=sparse_reports, sparse_reports=sparse_reports,
                              wait_ms=wait_ms, record_format=record_format)
        real = pulled.map(to_keras)
        padding = _padding_like(real.element_spec, worker)

        def wait_to_padding(*b):
            # a WAIT marker (no records: the master has nothing for this worker now)
            # trains a padding batch, so the step ends and the chief is not held up
            return tf.cond(tf.shape(b[0]["record_id"])[0] > 0, lambda: b, lambda: padding)

        if sparse_reports:
            real = real.map(wait_to_padding)
        pad = tf.data.Dataset.from_tensors(padding).repeat()
        return real.concatenate(pad)

    return keras.utils.experimental.DatasetCreator(dataset_fn)


class ShardingCallback(keras.callbacks.Callback):
    """Reports applied records (after every step, or per lease with sparse reports),
    stops ``fit`` when the master is done, and checkpoints model + optimizer + sharding
    state at step boundaries.

    Args:
      master / dataset: the job's master and the registered dataset.
      checkpoint_dir: where ``tf.train.CheckpointManager`` keeps checkpoints ('' = none).
      checkpoint_every_seconds: checkpoint this often (after draining the scheduled steps).
      check_every_batches: ask the master whether the dataset is finished this often.
      max_ahead: steps scheduled ahead of the executed ones (bounds the padding steps
        that still run after the data ended); with ``steps_per_execution`` > 1 at least
        two executions per worker stay scheduled, so that no worker waits for the chief.
      audit_records: if > 0, count per record id how often it was applied (a variable on
        the PS, updated in the step) — ``applied_counts()`` returns the counts.
      sparse_reports: steps record their lease position on the PS and report a lease
        when it is finished; this callback settles dead workers' leases from the record
        (pass the same to :func:`dataset_creator`).
      worker_slots: rows of the lease record (the largest worker index + 1 the job may
        scale to); 0 = the workers of the strategy's cluster.
      settle_seconds: with sparse reports, how often the chief asks the master for held
        leases (well under the master's ``--settle_seconds``).
    """

    def __init__(self, master: str, dataset: str, checkpoint_dir: str = "",
                 checkpoint_every_seconds: float = 30.0, check_every_batches: int = 16,
                 audit_records: int = 0, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 max_ahead: int = 16, sparse_reports: bool = False, worker_slots: int = 0,
                 settle_seconds: float = 1.0):
        super().__init__()
        self._ahead = collections.deque()
        self.max_ahead = max_ahead
        self._ahead_limit = max_ahead
        self._num_workers = 1
        from antdt_tf.sharding.client import ShardingClient

        accept_remote_logs(self)         # batch hooks under PSS (they see RemoteValues)
        self.master, self.dataset = master, dataset
        self.client = ShardingClient(master)
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every_seconds = checkpoint_every_seconds
        self.check_every_batches = check_every_batches
        self.audit_records = audit_records
        self.timeout_ms = timeout_ms
        self.applied = None
        self.started = None
        self.sparse_reports = sparse_reports
        self.worker_slots = worker_slots
        self.settle_seconds = settle_seconds
        self.lease_record = None
        self.worker_state = None  # per worker: refused lease, (micros, steps) unreported
        self.settled = 0          # held leases settled from the record
        self._last_check = time.monotonic()
        self.manager = None
        self._wrapped = None
        self._keeper = None
        self._last_checkpoint = time.monotonic()
        self.restored_from = ""

    # -------------------------------------------------------------- set-up

    def steps_upper_bound(self, batch_size: int) -> int:
        """A ``steps_per_epoch`` that can never cut the data short (the callback
        stops ``fit`` when the master says the data is done)."""
        p = self.client.progress(self.dataset).datasets[0]
        return 2 * (-(-p.records_per_epoch * p.num_epochs // batch_size)) + 1000

    def attach(self, model):
        """Wraps ``model.train_step`` — the model's own, a custom one included — in the
        step that keeps the master's ledger exact, and returns the model. Call it once,
        after ``compile`` and before :meth:`restore_or_initialize` and ``fit``.

        The wrapped step, on every batch of :func:`dataset_creator`:

        1. removes ``record_id`` and ``antdt`` (the lease position) from the features:
           the model's ``train_step`` gets ``(features, label, sample_weight)`` as
           ``parse`` made them;
        2. sets the sample weight to 0 for padding batches (after the data ended, or
           while the master has nothing for this worker) and for the rest of a lease the
           master refused (it expired while its worker was silent: another worker trains
           it);
        3. (sparse reports) writes where the lease was before this batch on the PS,
           then calls the model's ``train_step`` (so a kill that lets any of its updates
           land finds the record current), and reports to the master only after every
           variable update of the step has landed.

        What a custom ``train_step`` must respect: take ``sample_weight`` from
        ``keras.utils.unpack_x_y_sample_weight(data)`` and weight the loss with it (a
        step of weight 0 must not move the model: true for SGD and Adagrad; momentum
        and Adam still move a little); make every update of the step inside it (the
        report waits for the step's stateful ops, not for work done elsewhere); and
        keep ``steps_per_execution`` equal to :func:`dataset_creator`'s."""
        if self._wrapped is model:
            return model
        strategy = model.distribute_strategy
        if self.audit_records and self.applied is None:
            with strategy.scope():
                # applied: steps all of whose updates landed; started: steps that began
                # writing (a kill between the two leaves a torn step: started > applied)
                self.applied = tf.Variable(tf.zeros([self.audit_records], tf.int32),
                                           trainable=False, name="antdt_applied")
                self.started = tf.Variable(tf.zeros([self.audit_records], tf.int32),
                                           trainable=False, name="antdt_started")
        # PSS keeps its resolver privately (strategy.cluster_resolver is None)
        resolver = tf_internals.cluster_resolver(strategy)
        workers = len(resolver.cluster_spec().as_dict().get("worker", [])) if resolver else 0
        slots = max(self.worker_slots, workers)
        if slots <= 0:
            raise ValueError("pass worker_slots > 0 (the job's largest worker index + 1): "
                             "the strategy does not say")
        self._num_workers = workers or slots
        if self.worker_state is None:
            with strategy.scope():
                # per worker: (a lease the master refused a report of — expired while its
                # holder was silent, restored: its further batches are skipped; with
                # sparse reports the worker's own time and steps since its last report,
                # the Monitor's BPT: gaps between reports would count as idle time).
                # One variable, read and written unconditionally: a PS op inside a
                # tf.cond costs the step more than the op itself (keras_step_cost)
                self.worker_state = tf.Variable(
                    tf.tile(tf.constant([[-1, 0, 0]], tf.int64), [slots, 1]),
                    trainable=False, name="antdt_worker_state")
        if self.sparse_reports and self.lease_record is None:
            with strategy.scope():
                # not checkpointed: a restore re-issues every lease anyway; one row more
                # than the trainers' record: padding batches write there (no tf.cond)
                rows, cols = lease_record_shape(slots)
                self.lease_record = tf.Variable(
                    tf.fill([rows + 1, cols], tf.constant(-1, tf.int64)), trainable=False,
                    name="antdt_lease_record")
        original = model.train_step
        master, dataset, timeout_ms = self.master, self.dataset, self.timeout_ms
        applied_var, record_var, state_var = self.applied, self.lease_record, self.worker_state
        started_var = self.started
        trash_row = 2 * slots
        sparse = self.sparse_reports

        def train_step(data):
            start = tf.timestamp()    # the batch is here: the step's own time from now
            x, y, w = keras.utils.unpack_x_y_sample_weight(data)
            x = dict(x)
            meta, ids = x.pop("antdt"), x.pop("record_id")
            row = tf.reshape(meta["worker"], [1])
            vec = {k: tf.reshape(meta[k], [-1]) for k in
                   ("lease", "shard", "epoch", "applied", "length", "sparse")}
            lease = tf.reduce_max(vec["lease"])   # a batch never spans leases
            # a refused lease is not this worker's any more: its batch trains with
            # sample weight 0 (no gradient for SGD) and counts nowhere
            # the worker's row, read once: only this worker's steps write it, one at a
            # time, and each step's write is ordered before the next step's read (one
            # resource) — so it is current, and nothing waits on another read later
            state = tf.reshape(tf.gather(state_var, row), [3])
            refused = state[0]
            skip = tf.logical_and(lease >= 0, tf.equal(refused, lease))
            keep = tf.cast(tf.logical_not(skip), tf.float32)
            w = keep * tf.ones_like(vec["lease"], tf.float32) if w is None else (
                w * tf.cast(keep, w.dtype))
            real = tf.logical_and(vec["lease"] >= 0, tf.logical_not(skip))
            any_real = tf.reduce_any(real)
            n = tf.reduce_sum(tf.cast(real, tf.int64))

            def step():
                if record_var is None:
                    return original((x, y, w))
                # where the lease was *before* this batch, written before any update of
                # the step: if a kill lets any of them land, the record says so, and the
                # settle re-trains this batch only (written beside them, a kill could
                # land updates but not the record: the batch before, applied in full,
                # would be trained again too — two batches). A padding or skipped batch
                # writes the spare row, which nothing reads.
                written = lease_record_update(
                    record_var, meta["worker"], meta["incarnation"], lease,
                    tf.reduce_max(vec["applied"]) - n, n, real=any_real, spare_row=trash_row)
                with tf.control_dependencies([written]):
                    return original((x, y, w))

            report = {k: tf.boolean_mask(vec[k], real)
                      for k in ("lease", "shard", "epoch", "applied")}
            due = any_real
            if sparse:   # (padding rows have no lease: only real batches are due)
                due = tf.logical_and(any_real, report_due_tensor(
                    True, tf.reduce_min(vec["sparse"]), tf.reduce_max(vec["applied"]),
                    tf.reduce_max(vec["length"])))
            # the report goes out only after every update of the step has landed
            if started_var is None:
                logs, effects = run_step(step)
            else:
                # audit: `started` before any update of the step, `applied` after all of
                # them — a step cut by a kill counts in `started` only (see applied_counts)
                real_ids = tf.boolean_mask(tf.reshape(ids, [-1]), real)
                ones = tf.IndexedSlices(tf.ones_like(real_ids, tf.int32), real_ids)
                # (run_step collects the ops: a partitioned counter, a ShardedVariable,
                # returns neither a tensor nor an op)
                _, begun = run_step(lambda: started_var.scatter_add(ones))
                with tf.control_dependencies(begun):
                    logs, effects = run_step(step)
                with tf.control_dependencies(effects):
                    _, counted = run_step(lambda: applied_var.scatter_add(ones))
                effects = effects + counted
            zero = tf.constant(0, tf.int64)

            def send():
                timing = dict(micros=state[1] + this, steps=state[2] + 1) if sparse else {}
                return report_applied(master, dataset, dict(
                    report, worker=meta["worker"], incarnation=meta["incarnation"]),
                    timeout_ms, **timing)

            with tf.control_dependencies(effects):
                this = tf.cast((tf.timestamp() - start) * 1e6, tf.int64)
                rejected = tf.cond(due, send, lambda: zero)   # the RPC runs on the worker
            # one unconditional update of the row: a refused lease noted; the time
            # added up, or reset once reported
            if sparse:
                timing = tf.where(due, -state[1:], tf.where(
                    any_real, tf.stack([this, tf.constant(1, tf.int64)]),
                    tf.zeros([2], tf.int64)))
            else:
                timing = tf.zeros([2], tf.int64)
            delta = tf.concat([tf.reshape(tf.where(rejected > 0, lease - state[0], zero), [1]),
                               timing], 0)
            state_var.scatter_add(tf.IndexedSlices(tf.reshape(delta, [1, 3]), row))
            return logs

        model.train_step = train_step
        model.train_function = None      # rebuilt by fit() with the wrapped step
        self._wrapped = model
        if self.checkpoint_dir and self.manager is None:
            from antdt_tf.tf.checkpoint import ShardingStateSlot

            objects = {"model": model,
                       "sharding": ShardingStateSlot(self.client, [self.dataset])}
            if getattr(model, "optimizer", None) is not None:
                objects["optimizer"] = model.optimizer
            if self.applied is not None:
                objects["audit"] = tf.train.Checkpoint(applied=self.applied,
                                                       started=self.started)
            self.manager = tf.train.CheckpointManager(tf.train.Checkpoint(**objects),
                                                      self.checkpoint_dir, max_to_keep=3)
        return model

    def restore_or_initialize(self, model) -> str:
        """Restores model, optimizer (slots) and sharding state from the latest
        checkpoint; without one, writes an initial checkpoint (so a restart before the
        first boundary rolls the master back too). Returns the restored path or ''."""
        self._check_attached(model)
        if self.manager is None:
            return ""
        latest = self.manager.latest_checkpoint
        if latest:
            self.manager.checkpoint.restore(latest)
            log.info("restored %s", latest)
            self.restored_from = latest
            return latest
        self.manager.save()
        return ""

    def _check_attached(self, model) -> None:
        if self._wrapped is not model:
            raise ValueError(
                "ShardingCallback: this model's train_step is not wrapped; call "
                "`model = sharding.attach(model)` after compile and before "
                "restore_or_initialize and fit (the wrapped step is what reports the "
                "trained records to the master)")

    def set_model(self, model):
        super().set_model(model)
        self._check_attached(model)

    # -------------------------------------------------------------- hooks

    def _coordinator(self):
        return tf_internals.keras_coordinator(self.model)

    def settle(self, drained: bool = False) -> int:
        """Sparse reports: settles the leases the master holds for dead or silent
        workers from the PS record (``drained``: every scheduled step has finished —
        before a checkpoint — so also bring the master's count of every live lease up
        to the model, last batch included). Returns how many leases were held; sets
        ``stop_training`` when the master is done."""
        progress = self.client.progress(self.dataset).datasets[0]
        self._last_check = time.monotonic()
        if self.lease_record is not None and (progress.held or drained):
            apply_lease_records(self.client.apply_lease_record, self.dataset,
                                self.lease_record.numpy()[:-1], progress.held,
                                drained=drained)
            self.settled += len(progress.held)
        if progress.finished and self.model is not None:
            self.model.stop_training = True
        return len(progress.held)

    def save(self) -> str:
        """Drains the scheduled steps (so every pulled batch is trained and
        reported), then writes model + optimizer + sharding state."""
        coordinator = self._coordinator()
        if coordinator is not None:
            coordinator.join()
        if self.lease_record is not None:   # the snapshot agrees with the model
            self.settle(drained=True)
        path = self.manager.save()
        log.info("checkpoint %s written", path)
        self._last_checkpoint = time.monotonic()
        return path

    def on_train_begin(self, logs=None):
        spe = tf_internals.steps_per_execution(self.model)
        self._ahead_limit = max(-(-self.max_ahead // spe), 2 * self._num_workers)
        if self.lease_record is not None and self._keeper is None:
            # the master keeps dead workers' sparse leases for this chief however long
            # its main thread waits (a save's join, an evaluation, another callback)
            self._keeper = HeldLeaseKeeper(self.master, [self.dataset],
                                           every_seconds=self.settle_seconds).start()

    def on_train_batch_end(self, batch, logs=None):
        # Under PSS this runs when the step is *scheduled*, with its logs a RemoteValue.
        # Keep at most `max_ahead` steps scheduled beyond the executed ones, so that
        # when the data ends only that many padding steps are already queued.
        if logs is not None and hasattr(logs, "fetch"):
            self._ahead.append(logs)
            self._pace()
        if (self.manager is not None and
                time.monotonic() - self._last_checkpoint >= self.checkpoint_every_seconds):
            self.save()
            self._ahead.clear()
        if ((batch + 1) % self.check_every_batches == 0 or
                time.monotonic() - self._last_check >= self.settle_seconds):
            self.settle()

    def _pace(self) -> None:
        """Waits until at most ``_ahead_limit`` scheduled steps are unfinished, settling
        held leases meanwhile (a step can wait seconds for a worker PSS is recovering).

        It waits for *any* scheduled step to finish, not for the oldest: steps finish out
        of order, and waiting for the oldest — a straggler's — let the fast workers
        empty the queue and idle until it came back (measured: 0.7 s of a 7 s job with
        worker 2 slowed 4x, slower than bare ``model.fit``, which queues every step at
        once). It watches each step's completion event, the one TF's own ``fetch`` waits
        on (TF-private; without it, it falls back to fetching the oldest): no copy, no
        remote read on another thread — the settles' PS reads stay on this one."""
        while len(self._ahead) > self._ahead_limit:
            events = [tf_internals.completion_event(s) for s in self._ahead]
            if any(e is None for e in events):
                try:
                    self._ahead.popleft().fetch()   # waits for that step (main thread)
                except tf.errors.OpError:
                    # the step ran on a worker that died since: its result cannot be
                    # copied, but the step is done (or re-run elsewhere); only pacing here
                    pass
                continue
            self._ahead = collections.deque(
                s for s, e in zip(self._ahead, events) if not e.is_set())
            if len(self._ahead) <= self._ahead_limit:
                return
            tf_internals.completion_event(self._ahead[0]).wait(0.01)
            if (self.lease_record is not None
                    and time.monotonic() - self._last_check >= self.settle_seconds):
                self.settle()

    def on_train_end(self, logs=None):
        coordinator = self._coordinator()
        if coordinator is not None:
            coordinator.join()
        if self.lease_record is not None:
            self.settle()
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None
        if not self.client.progress(self.dataset).datasets[0].finished:
            log.warning("fit ended before the master finished the dataset: raise "
                        "steps_per_epoch (see steps_upper_bound)")

    def applied_counts(self):
        """Audit mode, per record: how many steps that trained it had *every* update
        land (the step's variable writes are separate RPCs to the PS; this count is
        written after all of them). See :meth:`started_counts`."""
        from antdt_tf.tf.variables import full_value

        return full_value(self.applied).numpy()

    def started_counts(self):
        """Audit mode, per record: how many steps that trained it began (written before
        any of the step's updates). ``started - applied`` > 0 marks a record whose step
        a kill cut: anywhere from none to all of that step's updates landed,
        and the batch was trained again (the lease record says where the lease was
        before it). At most one batch per killed worker."""
        from antdt_tf.tf.variables import full_value

        return full_value(self.started).numpy()


class ClusterMonitorCallback(keras.callbacks.Callback):
    """Chief: about every ``report_seconds`` tells the master's Monitor what each worker
    trained (the master's own count, from the workers' reports) and how long every PS
    takes to answer (``probe``: :class:`antdt_tf.tf.ps_probe.PsProbe`), as the custom
    loop's coordinator does — so the Controller judges (and may replace) a slow PS in a
    ``model.fit`` job too. Best effort: a failed report is logged, training goes on.

    Under PSS the batch hooks run on the chief's main thread as steps are scheduled,
    which is also where the probe's remote reads must run (concurrent remote reads from
    several threads crashed TF here). ``client``: a ``ShardingClient`` of the master the
    chief already has (not closed here); None opens (and closes) one."""

    def __init__(self, master: str, dataset: str, probe, incarnation: int,
                 report_seconds: float = 1.0, client=None):
        super().__init__()
        from antdt_tf.monitor.client import MonitorClient
        from antdt_tf.sharding.client import ShardingClient

        accept_remote_logs(self)
        self.dataset, self.probe, self.incarnation = dataset, probe, incarnation
        self.report_seconds = report_seconds
        self._own_client = client is None
        self.client = ShardingClient(master) if client is None else client
        self.monitor = MonitorClient(master)
        self.reports = 0
        self._last = 0.0

    def report(self) -> None:
        from antdt_tf.sharding.client import worker_split

        self._last = time.monotonic()
        try:
            shards, records = worker_split(self.client.progress(self.dataset))
            self.monitor.report_trainer(self.incarnation, list(zip(shards, records)),
                                        ps_latency_ms=self.probe.measure())
            self.reports += 1
        except Exception as e:  # progress reports are best effort; training goes on
            log.warning("trainer report not delivered: %s", e)

    def on_train_begin(self, logs=None):
        # the first report one period in, not at the first batch: the first step's
        # function is still being sent to the workers then, and a remote read racing
        # with that once sent a request TF could not parse (a worker's "Unable to parse
        # request", the job failed); the custom loop's first report also waits a period
        self._last = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if time.monotonic() - self._last >= self.report_seconds:
            self.report()

    def on_train_end(self, logs=None):
        self.report()
        if self._own_client:
            self.client.close()
        self.monitor.close()
