"""``model.fit`` under ParameterServerStrategy, fed by the master (tf-keras).

Keras 3 has no ParameterServerStrategy support, so this needs tf-keras 2.21 and
``TF_USE_LEGACY_KERAS=1`` set before TensorFlow is imported. Three pieces::

    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf
    from antdt_tf.tf import keras as antdt_keras

    with strategy.scope():
        model = build_your_model()          # inputs: a dict of the decoded features
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss=...)
    sharding = antdt_keras.ShardingCallback(master, "train", checkpoint_dir=ckpt_dir)
    sharding.restore_or_initialize(model)   # model, optimizer and sharding state
    model.fit(antdt_keras.dataset_creator(master, "train", batch_size=256),
              epochs=1, steps_per_epoch=sharding.steps_upper_bound(256),
              callbacks=[sharding])

- :func:`dataset_creator`: each worker's pipeline pulls shards from the master
  (:func:`antdt_tf.tf.pull.pull_dataset`) and yields ``(features, label, sample_weight)``.
  ``model.fit`` under PSS needs an endless dataset (a finite one ends ``fit`` with
  ``CancelledError``, measured), so after the last shard it yields one-record padding
  batches with sample weight 0 — a no-op for SGD and Adagrad (momentum and Adam still
  move the weights a little on such steps).
- :class:`ShardingCallback`: wraps the model's ``train_step`` so that after every step
  the worker reports the applied records to the master (the same exactness as the
  custom loop: at most one batch per failure applied twice or lost), stops ``fit`` when
  the master says every epoch is done, and checkpoints model, optimizer and sharding
  state together at step boundaries (it drains the scheduled steps first).
"""

from __future__ import annotations

import logging
import time

import tensorflow as tf
import tf_keras as keras   # the [tf] extra installs it; TF_USE_LEGACY_KERAS=1 makes it tf.keras

from antdt_tf.data.criteo import NUM_DENSE, NUM_SPARSE
from antdt_tf.tf.pull import DEFAULT_TIMEOUT_MS, pull_dataset, report_applied, run_step

log = logging.getLogger(__name__)


def _padding(worker, incarnation):
    """One zero record with sample weight 0 and no lease: trains nothing."""
    features = {"dense": tf.zeros([1, NUM_DENSE]), "sparse": tf.zeros([1, NUM_SPARSE], tf.int64),
                "record_id": tf.fill([1], tf.constant(-1, tf.int64)),
                "antdt": {"lease": tf.fill([1], tf.constant(-1, tf.int64)),
                          "shard": tf.zeros([1], tf.int64), "epoch": tf.zeros([1], tf.int32),
                          "applied": tf.zeros([1], tf.int64), "length": tf.zeros([1], tf.int64),
                          "sparse": tf.zeros([1], tf.int64),
                          "worker": worker, "incarnation": incarnation}}
    return features, tf.zeros([1]), tf.zeros([1])


def dataset_creator(master: str, dataset: str, batch_size: int,
                    timeout_ms: int = DEFAULT_TIMEOUT_MS):
    """A Keras ``DatasetCreator`` whose per-worker pipelines pull from the master."""
    def dataset_fn(input_context):
        del input_context   # shards come from the master, not from a static split
        pulled = pull_dataset(master, dataset, batch_size, timeout_ms=timeout_ms)

        def to_keras(b):
            features = {"dense": b["dense"], "sparse": b["sparse"], "record_id": b["record_id"],
                        "antdt": b["antdt"]}
            return features, b["label"], tf.ones_like(b["label"])

        real = pulled.map(to_keras)
        worker = tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(),
                         tf.int64)
        pad = tf.data.Dataset.from_tensors(_padding(worker, tf.constant(-1, tf.int64))).repeat()
        return real.concatenate(pad)

    return keras.utils.experimental.DatasetCreator(dataset_fn)


class ShardingCallback(keras.callbacks.Callback):
    """Reports applied records after every step, stops ``fit`` when the master is done,
    and checkpoints model + optimizer + sharding state at step boundaries.

    Args:
      master / dataset: the job's master and the registered dataset.
      checkpoint_dir: where ``tf.train.CheckpointManager`` keeps checkpoints ('' = none).
      checkpoint_every_seconds: checkpoint this often (after draining the scheduled steps).
      check_every_batches: ask the master whether the dataset is finished this often.
      max_ahead: steps scheduled ahead of the executed ones (bounds the padding steps
        that still run after the data ended).
      audit_records: if > 0, count per record id how often it was applied (a variable on
        the PS, updated in the step) — ``applied_counts()`` returns the counts.
    """

    def __init__(self, master: str, dataset: str, checkpoint_dir: str = "",
                 checkpoint_every_seconds: float = 30.0, check_every_batches: int = 16,
                 audit_records: int = 0, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 max_ahead: int = 16):
        super().__init__()
        import collections

        self._ahead = collections.deque()
        self.max_ahead = max_ahead
        from antdt_tf.sharding.client import ShardingClient

        self._supports_tf_logs = True    # batch hooks under PSS (they see RemoteValues)
        self.master, self.dataset = master, dataset
        self.client = ShardingClient(master)
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every_seconds = checkpoint_every_seconds
        self.check_every_batches = check_every_batches
        self.audit_records = audit_records
        self.timeout_ms = timeout_ms
        self.applied = None
        self.manager = None
        self._wrapped = None
        self._last_checkpoint = time.monotonic()
        self.restored_from = ""

    # -------------------------------------------------------------- set-up

    def steps_upper_bound(self, batch_size: int) -> int:
        """A ``steps_per_epoch`` that can never cut the data short (the callback
        stops ``fit`` when the master says the data is done)."""
        p = self.client.progress(self.dataset).datasets[0]
        return 2 * (-(-p.records_per_epoch * p.num_epochs // batch_size)) + 1000

    def _ensure_model_ready(self, model):
        if self._wrapped is model:
            return
        strategy = model.distribute_strategy
        if self.audit_records and self.applied is None:
            with strategy.scope():
                self.applied = tf.Variable(tf.zeros([self.audit_records], tf.int32),
                                           trainable=False, name="antdt_applied")
        original = model.train_step
        master, dataset, timeout_ms = self.master, self.dataset, self.timeout_ms
        applied_var = self.applied

        def train_step(data):
            x, y, w = keras.utils.unpack_x_y_sample_weight(data)
            x = dict(x)
            meta, ids = x.pop("antdt"), x.pop("record_id")

            def step():
                logs = original((x, y, w))
                if applied_var is not None:   # counted with the step, before the report
                    real_ids = tf.boolean_mask(tf.reshape(ids, [-1]), real)
                    applied_var.scatter_add(tf.IndexedSlices(
                        tf.ones_like(real_ids, tf.int32), real_ids))
                return logs

            vec = {k: tf.reshape(meta[k], [-1]) for k in ("lease", "shard", "epoch", "applied")}
            real = vec["lease"] >= 0
            report = {k: tf.boolean_mask(v, real) for k, v in vec.items()}
            # the report goes out only after every update of the step has landed
            logs, effects = run_step(step)

            def send():
                return report_applied(master, dataset, dict(
                    report, worker=meta["worker"], incarnation=meta["incarnation"]),
                    timeout_ms)

            with tf.control_dependencies(effects):
                tf.cond(tf.reduce_any(real), send, lambda: tf.constant(0, tf.int64))
            return logs

        model.train_step = train_step
        model.train_function = None      # rebuilt by fit() with the wrapped step
        self._wrapped = model
        if self.checkpoint_dir and self.manager is None:
            from antdt_tf.tf.checkpoint import _ShardingStateSlot

            objects = {"model": model,
                       "sharding": _ShardingStateSlot(self.client, [self.dataset])}
            if getattr(model, "optimizer", None) is not None:
                objects["optimizer"] = model.optimizer
            if self.applied is not None:
                objects["audit"] = tf.train.Checkpoint(applied=self.applied)
            self.manager = tf.train.CheckpointManager(tf.train.Checkpoint(**objects),
                                                      self.checkpoint_dir, max_to_keep=3)

    def restore_or_initialize(self, model) -> str:
        """Restores model, optimizer (slots) and sharding state from the latest
        checkpoint; without one, writes an initial checkpoint (so a restart before the
        first boundary rolls the master back too). Returns the restored path or ''."""
        self._ensure_model_ready(model)
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

    def set_model(self, model):
        super().set_model(model)
        self._ensure_model_ready(model)

    # -------------------------------------------------------------- hooks

    def _coordinator(self):
        return getattr(self.model, "_cluster_coordinator", None)

    def save(self) -> str:
        """Drains the scheduled steps (so every pulled batch is trained and
        reported), then writes model + optimizer + sharding state."""
        coordinator = self._coordinator()
        if coordinator is not None:
            coordinator.join()
        path = self.manager.save()
        log.info("checkpoint %s written", path)
        self._last_checkpoint = time.monotonic()
        return path

    def on_train_batch_end(self, batch, logs=None):
        # Under PSS this runs when the step is *scheduled*, with its logs a RemoteValue.
        # Keep at most `max_ahead` steps scheduled beyond the executed ones, so that
        # when the data ends only that many padding steps are already queued.
        if logs is not None and hasattr(logs, "fetch"):
            self._ahead.append(logs)
            if len(self._ahead) > self.max_ahead:
                try:
                    self._ahead.popleft().fetch()    # waits for that step (main thread only)
                except tf.errors.OpError:
                    # the step ran on a worker that died since: its result cannot be
                    # copied, but the step is done (or re-run elsewhere); only pacing here
                    pass
        if (self.manager is not None and
                time.monotonic() - self._last_checkpoint >= self.checkpoint_every_seconds):
            self.save()
            self._ahead.clear()
        if (batch + 1) % self.check_every_batches == 0:
            if self.client.progress(self.dataset).datasets[0].finished:
                self.model.stop_training = True

    def on_train_end(self, logs=None):
        coordinator = self._coordinator()
        if coordinator is not None:
            coordinator.join()
        if not self.client.progress(self.dataset).datasets[0].finished:
            log.warning("fit ended before the master finished the dataset: raise "
                        "steps_per_epoch (see steps_upper_bound)")

    def applied_counts(self):
        """Per record: how many times its gradient was applied (audit mode)."""
        from antdt_tf.tf.variables import full_value

        return full_value(self.applied).numpy()
