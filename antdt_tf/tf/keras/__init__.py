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

- :func:`dataset_creator` (:mod:`.data`): each worker's pipeline pulls shards from the
  master (:func:`antdt_tf.tf.pull.pull_dataset`) and yields ``(features, label,
  sample_weight)``, then endless padding batches of sample weight 0 (``fit`` under PSS
  needs an endless dataset).
- :class:`ShardingCallback` (:mod:`.callback`): its ``attach`` wraps the model's
  ``train_step`` in :class:`~antdt_tf.tf.keras.step.ReportingStep` (:mod:`.step`) so that
  the worker tells the master how far its lease got (the same exactness as the custom
  loop: at most one batch per failure applied twice or lost); the callback paces the
  scheduled steps and settles leases (:mod:`.pacing`), stops ``fit`` when the master
  says every epoch is done, and checkpoints model, optimizer and sharding state
  together at step boundaries (:mod:`.checkpointing`; it drains the scheduled steps
  first).
- :class:`ClusterMonitorCallback` (:mod:`.monitor`): the chief's reports to the
  master's Monitor.

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

from antdt_tf.tf.keras.callback import ShardingCallback
from antdt_tf.tf.keras.data import dataset_creator, default_parse
from antdt_tf.tf.keras.monitor import ClusterMonitorCallback

__all__ = ["ClusterMonitorCallback", "ShardingCallback", "dataset_creator", "default_parse"]
