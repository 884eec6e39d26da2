"""A ranking model's tf-keras training program, written as any user writes one: its own
model (two embedding tables and an MLP), its own ``train_step`` (which also counts, on
the PS, how often each record was trained: the user's own audit), its own TFRecord
data (``python -m keras_examples.clicks`` writes some). antdt-tf runs it as the job
(docs/program.md)::

    python -m keras_examples.clicks --out=/shared/clicks --files=4 --records_per_file=25000
    antdt-launch --api=keras --program=keras_examples.ranker \\
        --data='/shared/clicks/part-*.tfrecord' -- --batch_size=256

Copy it into a directory of your own and pass ``--program=/that/dir/train.py``: it needs
no edit to run there, on hosts (agents) or locally. The job comes in through the
environment (``antdt_tf.program.context()``: TF_CONFIG, the master, the checkpoint dir).
"""

import os
os.environ["TF_USE_LEGACY_KERAS"] = "1"     # tf-keras: Keras 3 has no PSS

import argparse

import tensorflow as tf

from antdt_tf import program
from antdt_tf.data.metrics import audit_summary
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.tf import keras as antdt_keras
from antdt_tf.tf.formats import TFRecordExamples
from antdt_tf.tf.variables import full_value

FEATURES = {"user": tf.io.FixedLenFeature([], tf.int64),
            "item": tf.io.FixedLenFeature([], tf.int64),
            "rid": tf.io.FixedLenFeature([], tf.int64),
            "label": tf.io.FixedLenFeature([], tf.float32)}


def parse(batch):
    features = dict(batch)
    return features, features.pop("label")


class Ranker(tf.keras.Model):
    def __init__(self, num_records):
        super().__init__()
        self.user_emb = tf.keras.layers.Embedding(1000, 8)
        self.item_emb = tf.keras.layers.Embedding(1000, 8)
        self.hidden = tf.keras.layers.Dense(16, activation="relu")
        self.out = tf.keras.layers.Dense(1, activation="sigmoid")
        self.seen = tf.Variable(tf.zeros([num_records], tf.int32), trainable=False)

    def call(self, x, training=False):
        u, i = self.user_emb(x["user"] % 1000), self.item_emb(x["item"] % 1000)
        return self.out(self.hidden(tf.concat([u, i, u * i], axis=1)))

    def train_step(self, data):
        x, y, w = tf.keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(tf.reshape(y, [-1, 1]), self(x, training=True),
                                      sample_weight=w)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        trained = tf.boolean_mask(x["rid"], w > 0)
        self.seen.scatter_add(tf.IndexedSlices(tf.ones_like(trained, tf.int32), trained))
        return {"loss": loss}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--steps_per_execution", type=int, default=4)
    args = ap.parse_args()
    ctx = program.context()
    with ShardingClient(ctx.master) as client:
        progress = client.progress(ctx.dataset).datasets[0]
        num_records, epochs = int(progress.records_per_epoch), int(progress.num_epochs)
    strategy = tf.distribute.experimental.ParameterServerStrategy(ctx.cluster_resolver())
    with strategy.scope():
        model = Ranker(num_records)
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
                      loss=tf.keras.losses.BinaryCrossentropy(),
                      steps_per_execution=args.steps_per_execution)
    sharding = antdt_keras.ShardingCallback(
        ctx.master, ctx.dataset, checkpoint_dir=ctx.checkpoint_dir,
        checkpoint_every_seconds=ctx.checkpoint_every_seconds, sparse_reports=True,
        worker_slots=ctx.worker_slots)
    model = sharding.attach(model)
    sharding.restore_or_initialize(model)
    data = antdt_keras.dataset_creator(
        ctx.master, ctx.dataset, args.batch_size, sparse_reports=True, parse=parse,
        record_format=TFRecordExamples(FEATURES),
        steps_per_execution=args.steps_per_execution)
    model.fit(data, epochs=1, steps_per_epoch=sharding.steps_upper_bound(args.batch_size),
              callbacks=[sharding], verbose=0)
    seen = full_value(model.seen).numpy()
    ctx.write_report({"batch_size": args.batch_size, "audit": audit_summary(seen, epochs)})


if __name__ == "__main__":
    program.run(main)
