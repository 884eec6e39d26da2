"""One's own model, ``train_step`` and data with tf-keras ``model.fit`` under
ParameterServerStrategy, fed by the antdt-tf master — the recipe of docs/keras.md.

The data: TFRecord files of ``tf.train.Example`` with ``user`` (int64), ``item`` (int64),
``rid`` (int64, the record's own id) and ``label`` (float, 0 or 1). The model: two
embedding tables (split over the PS) and a small MLP, with its own ``train_step`` that
also counts, on the PS, how often each record id was trained (the user's own audit).

The chief (this program) registers the files with the master, attaches the sharding
hook to the model and runs ``fit``; PS and worker tasks are plain TF servers
(``python -m antdt_tf.tf.server --job=ps|worker --index=i --cluster=...``)::

    antdt-master --port=7000 --state_dir=/tmp/m &
    python -m keras_examples.own_model --cluster='{"chief": [...], "ps": [...],
        "worker": [...]}' --master=127.0.0.1:7000 --data=part-0.tfrecord,part-1.tfrecord

Without ``antdt-launch`` nothing restarts a task; the master learns that a worker
died when its restarted process opens its pipeline again (a new incarnation: the old
one's leases are released, sparse ones held for this chief to settle), when
someone reports it (``ShardingClient.report_task_failure``, what a supervisor or
cluster manager calls), or when its leases expire.
"""

from __future__ import annotations

import json
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"   # before TensorFlow: tf.keras is tf-keras (PSS)

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("cluster", None, 'Cluster spec JSON with "chief", "ps" and "worker".')
flags.DEFINE_string("master", None, "The antdt-tf master (host:port).")
flags.DEFINE_list("data", [], "TFRecord files of tf.train.Example (registered in order).")
flags.DEFINE_string("dataset", "own", "Dataset name on the master.")
flags.DEFINE_integer("records_per_shard", 2048, "Records per shard.")
flags.DEFINE_integer("batch_size", 128, "Records per batch.")
flags.DEFINE_integer("steps_per_execution", 16, "Steps per scheduled closure (compile's).")
flags.DEFINE_integer("users", 1000, "Rows of the user table (ids are taken modulo).")
flags.DEFINE_integer("items", 1000, "Rows of the item table (ids are taken modulo).")
flags.DEFINE_string("checkpoint_dir", "", "Checkpoint model + optimizer + sharding state.")
flags.DEFINE_float("checkpoint_every_seconds", 30.0, "Checkpoint this often.")
flags.DEFINE_string("report_json", "", "Write the per-record counts summary here.")

def features():
    import tensorflow as tf

    return {"user": tf.io.FixedLenFeature([], tf.int64),
            "item": tf.io.FixedLenFeature([], tf.int64),
            "rid": tf.io.FixedLenFeature([], tf.int64),
            "label": tf.io.FixedLenFeature([], tf.float32)}


def parse(batch: dict):
    """Decoded batch -> (features, label): the label f32[n] (0/1) apart, everything
    else (``rid`` included: the model ignores it, the step counts it) as features."""
    features = dict(batch)
    return features, features.pop("label")


def build_model(users: int, items: int, num_records: int, dim: int = 8):
    """A two-tower-ish CTR model whose ``train_step`` is its own: the usual
    forward/backward, plus a per-record counter on the PS (``seen``)."""
    import tensorflow as tf

    keras = tf.keras

    class OwnModel(keras.Model):
        def __init__(self):
            super().__init__()
            self.user_emb = keras.layers.Embedding(users, dim)
            self.item_emb = keras.layers.Embedding(items, dim)
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.out = keras.layers.Dense(1, activation="sigmoid")
            self.seen = tf.Variable(tf.zeros([num_records], tf.int32), trainable=False,
                                    name="seen")

        def call(self, x, training=False):
            u = self.user_emb(tf.math.floormod(x["user"], users))
            i = self.item_emb(tf.math.floormod(x["item"], items))
            return self.out(self.hidden(tf.concat([u, i, u * i], axis=1)))   # [n, 1]

        def train_step(self, data):
            # what the sharding hook asks of a train_step: take sample_weight and weight
            # the loss with it (0 for padding / refused batches); update inside the step
            x, y, w = keras.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                p = self(x, training=True)
                loss = self.compiled_loss(tf.reshape(y, [-1, 1]), p, sample_weight=w)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            trained = tf.boolean_mask(x["rid"], w > 0)
            self.seen.scatter_add(tf.IndexedSlices(tf.ones_like(trained, tf.int32), trained))
            return {"loss": loss}

    return OwnModel()


def train(extra_callbacks=()) -> dict:
    """The chief's whole job; returns (and writes) the summary."""
    import tensorflow as tf

    from antdt_tf.sharding.client import ShardingClient
    from antdt_tf.sharding.plan import DataFile, DatasetSpec
    from antdt_tf.tf import keras as antdt_keras
    from antdt_tf.tf.formats import TFRecordExamples

    cluster = json.loads(FLAGS.cluster)
    client = ShardingClient(FLAGS.master)
    # 1. the data: the files and their record counts (registering again is a no-op)
    files = tuple(DataFile(path, TFRecordExamples.count(path)) for path in FLAGS.data)
    client.register_dataset(DatasetSpec(FLAGS.dataset, records_per_shard=FLAGS.records_per_shard,
                                        files=files))
    num_records = sum(f.num_records for f in files)

    # 2. the strategy: embeddings split over every PS
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.
        MinSizePartitioner(min_shard_bytes=16 << 10, max_shards=len(cluster["ps"])))
    with strategy.scope():
        model = build_model(FLAGS.users, FLAGS.items, num_records)
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                      loss=tf.keras.losses.BinaryCrossentropy(),
                      steps_per_execution=FLAGS.steps_per_execution)

    # 3. the sharding hook: explicit, on the model; then restore (or initialize)
    sharding = antdt_keras.ShardingCallback(
        FLAGS.master, FLAGS.dataset, checkpoint_dir=FLAGS.checkpoint_dir,
        checkpoint_every_seconds=FLAGS.checkpoint_every_seconds, sparse_reports=True)
    model = sharding.attach(model)
    sharding.restore_or_initialize(model)

    # 4. fit on the master's shards, in this format, parsed by this function
    data = antdt_keras.dataset_creator(FLAGS.master, FLAGS.dataset, FLAGS.batch_size,
                                       sparse_reports=True, parse=parse,
                                       record_format=TFRecordExamples(features()),
                                       steps_per_execution=FLAGS.steps_per_execution)
    model.fit(data, epochs=1, steps_per_epoch=sharding.steps_upper_bound(FLAGS.batch_size),
              callbacks=[sharding, *extra_callbacks], verbose=0)

    from antdt_tf.tf.variables import full_value

    seen = full_value(model.seen).numpy()
    progress = client.progress(FLAGS.dataset).datasets[0]
    summary = {"records": int(progress.records_done_total), "finished": progress.finished,
               "seen_0": int((seen == 0).sum()), "seen_1": int((seen == 1).sum()),
               "seen_2plus": int((seen >= 2).sum()),
               "settled_held_leases": sharding.settled}
    client.close()
    if FLAGS.report_json:
        with open(FLAGS.report_json, "w") as f:
            json.dump(summary, f)
    return summary


def write_examples(path: str, first_rid: int, count: int, seed: int = 0) -> None:
    """Writes ``count`` synthetic examples (rid ``first_rid`` ...) with a learnable
    label: clicks happen when user and item share parity."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    users, items = rng.integers(0, 1000, count), rng.integers(0, 1000, count)
    with tf.io.TFRecordWriter(path) as w:
        for k in range(count):
            label = float((users[k] + items[k]) % 2 == 0)
            ex = tf.train.Example(features=tf.train.Features(feature={
                "user": tf.train.Feature(int64_list=tf.train.Int64List(value=[users[k]])),
                "item": tf.train.Feature(int64_list=tf.train.Int64List(value=[items[k]])),
                "rid": tf.train.Feature(int64_list=tf.train.Int64List(value=[first_rid + k])),
                "label": tf.train.Feature(float_list=tf.train.FloatList(value=[label]))}))
            w.write(ex.SerializeToString())


def main(argv):
    del argv
    print(json.dumps(train()))


if __name__ == "__main__":
    flags.mark_flags_as_required(["cluster", "master"])
    app.run(main)
