"""Users' own training programs, as a user writes them (docs/program.md): each test
writes one into a temporary directory outside the package, with its own TFRecord data,
and submits it through ``antdt-launch --program``. Each program has its own model, its own
``train_step`` and its own per-record counter on the PS (``seen``), and writes that
count's summary as its report, so the job's audit is the user's own."""

from __future__ import annotations

import pathlib
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent

# a tf-keras ranking model: two embedding tables and an MLP, its own train_step
KERAS_PROGRAM = (ROOT / "keras_examples" / "ranker.py").read_text()   # the shipped one

# a ClusterCoordinator loop (PullTrainer) over the user's own tf.Module and step
CUSTOM_LOOP_PROGRAM = '''
import argparse

import tensorflow as tf

from antdt_tf import program
from antdt_tf.data.metrics import audit_summary
from antdt_tf.sharding.client import ShardingClient, Task
from antdt_tf.tf.checkpoint import ShardingCheckpoint
from antdt_tf.tf.formats import TFRecordExamples
from antdt_tf.tf.pull import PullTrainer
from antdt_tf.tf.variables import full_value

FEATURES = {"user": tf.io.FixedLenFeature([], tf.int64),
            "item": tf.io.FixedLenFeature([], tf.int64),
            "rid": tf.io.FixedLenFeature([], tf.int64),
            "label": tf.io.FixedLenFeature([], tf.float32)}


class Ranker(tf.Module):
    def __init__(self, num_records, lr=0.1):
        super().__init__()
        init = tf.random_normal_initializer(stddev=0.05, seed=1)
        self.user = tf.Variable(init([1000, 8]), name="user")
        self.item = tf.Variable(init([1000, 8]), name="item")
        self.w = tf.Variable(init([24, 1]), name="w")
        self.seen = tf.Variable(tf.zeros([num_records], tf.int32), trainable=False)
        self.lr = lr

    def train_step(self, batch, record_ids):        # on a worker, in replica context
        users, items = batch["user"] % 1000, batch["item"] % 1000
        with tf.GradientTape() as tape:
            u = tf.nn.embedding_lookup(self.user, users)
            i = tf.nn.embedding_lookup(self.item, items)
            logits = tf.matmul(tf.concat([u, i, u * i], axis=1), self.w)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                tf.reshape(batch["label"], [-1, 1]), logits))
        gu, gi, gw = tape.gradient(loss, [self.user, self.item, self.w])
        self.user.scatter_sub(tf.IndexedSlices(self.lr * gu.values, gu.indices))
        self.item.scatter_sub(tf.IndexedSlices(self.lr * gi.values, gi.indices))
        self.w.assign_sub(self.lr * gw)
        rid = batch["rid"]
        self.seen.scatter_add(tf.IndexedSlices(tf.ones_like(rid, tf.int32), rid))
        return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch_size", type=int, default=64)
    args = ap.parse_args()
    ctx = program.context()
    client = ShardingClient(ctx.master, Task("chief", 0, ctx.generation))
    progress = client.progress(ctx.dataset).datasets[0]
    num_records, epochs = int(progress.records_per_epoch), int(progress.num_epochs)
    strategy = tf.distribute.experimental.ParameterServerStrategy(ctx.cluster_resolver())
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = Ranker(num_records)
    trainer = PullTrainer(strategy, coordinator, ctx.master, ctx.dataset, model.train_step,
                          batch_size=args.batch_size, num_workers=len(ctx.cluster["worker"]),
                          worker_slots=ctx.worker_slots, steps_per_closure=4,
                          progress_fn=lambda: client.progress(ctx.dataset).datasets[0],
                          checkpoint_every_seconds=ctx.checkpoint_every_seconds,
                          record_fn=client.apply_lease_record,
                          record_format=TFRecordExamples(FEATURES))
    ckpt = ShardingCheckpoint(ctx.checkpoint_dir, model, client, [ctx.dataset],
                              trainer=trainer.counters)
    ckpt.restore_or_initialize()
    trainer.on_checkpoint = ckpt.save
    trainer.train()
    seen = full_value(model.seen).numpy()
    ctx.write_report({"batch_size": args.batch_size, "audit": audit_summary(seen, epochs)})


if __name__ == "__main__":
    program.run(main)
'''

# TF1 between-graph on this TensorFlow: every worker runs this (worker 0 the chief)
MTS_PROGRAM = '''
import argparse

import tensorflow as tf

from antdt_tf import program
from antdt_tf.data.metrics import audit_summary
from antdt_tf.estimator import ShardFeed
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.tf.formats import TFRecordExamples

FEATURES = {"user": tf.io.FixedLenFeature([], tf.int64),
            "item": tf.io.FixedLenFeature([], tf.int64),
            "rid": tf.io.FixedLenFeature([], tf.int64),
            "label": tf.io.FixedLenFeature([], tf.float32)}


def train_op(features, labels, num_records):
    v1 = tf.compat.v1
    init = v1.random_normal_initializer(stddev=0.05, seed=1)
    user = v1.get_variable("user", [1000, 8], initializer=init, use_resource=True)
    item = v1.get_variable("item", [1000, 8], initializer=init, use_resource=True)
    w = v1.get_variable("w", [24, 1], initializer=init, use_resource=True)
    seen = v1.get_variable("seen", [num_records], tf.int32, v1.zeros_initializer(),
                           trainable=False, use_resource=True)
    u = tf.nn.embedding_lookup(user, features["user"] % 1000)
    i = tf.nn.embedding_lookup(item, features["item"] % 1000)
    logits = tf.matmul(tf.concat([u, i, u * i], axis=1), w)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        tf.reshape(labels, [-1, 1]), logits))
    step = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=v1.train.get_or_create_global_step())
    rid = features["rid"]
    count = seen.scatter_add(tf.IndexedSlices(tf.ones_like(rid, tf.int32), rid))
    return tf.group(step, count), seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch_size", type=int, default=64)
    args = ap.parse_args()
    ctx = program.context()
    v1 = tf.compat.v1
    i, chief = ctx.index, ctx.index == 0
    cluster = tf.train.ClusterSpec(ctx.cluster)
    server = tf.distribute.Server(cluster, job_name="worker", task_index=i, start=True)
    v1.disable_eager_execution()
    with ShardingClient(ctx.master) as client:
        progress = client.progress(ctx.dataset).datasets[0]
        num_records, epochs = int(progress.records_per_epoch), int(progress.num_epochs)
    feed = ShardFeed(ctx.master, ctx.dataset, args.batch_size, worker=i,
                     worker_device=f"/job:worker/task:{i}",
                     record_format=TFRecordExamples(FEATURES))
    with v1.device(v1.train.replica_device_setter(cluster=cluster,
                                                  worker_device=f"/job:worker/task:{i}")):
        features, labels = feed.input_fn()
        op, seen = train_op(features, labels, num_records)
    hooks = feed.hooks()
    chief_hooks = feed.chief_hooks(ctx.checkpoint_dir, save_secs=1) if chief else []
    config = v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{i}"])
    with v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=chief, checkpoint_dir=ctx.checkpoint_dir,
            save_checkpoint_secs=None, save_checkpoint_steps=None,
            save_summaries_steps=None, save_summaries_secs=None, log_step_count_steps=None,
            hooks=hooks, chief_only_hooks=chief_hooks, config=config) as sess:
        try:
            while not sess.should_stop():
                sess.run(op)
        except tf.errors.OutOfRangeError:
            pass
    if chief:
        with v1.Session(server.target, config=config) as s:
            counts = s.run(seen)
        ctx.write_report({"batch_size": args.batch_size,
                          "audit": audit_summary(counts, epochs)})
    feed.close()


if __name__ == "__main__":
    program.run(main)
'''

# tf.estimator (TF 2.15): every task runs this; Estimator reads TF_CONFIG itself
ESTIMATOR_PROGRAM = '''
import argparse

import tensorflow as tf

from antdt_tf import program
from antdt_tf.data.metrics import audit_summary
from antdt_tf.estimator import ShardFeed
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.tf.formats import TFRecordExamples

FEATURES = {"user": tf.io.FixedLenFeature([], tf.int64),
            "item": tf.io.FixedLenFeature([], tf.int64),
            "rid": tf.io.FixedLenFeature([], tf.int64),
            "label": tf.io.FixedLenFeature([], tf.float32)}


def model_fn(features, labels, mode, params):
    v1 = tf.compat.v1
    init = v1.random_normal_initializer(stddev=0.05, seed=1)
    user = v1.get_variable("user", [1000, 8], initializer=init)
    item = v1.get_variable("item", [1000, 8], initializer=init)
    w = v1.get_variable("w", [24, 1], initializer=init)
    seen = v1.get_variable("seen", [params["num_records"]], tf.int32,
                           v1.zeros_initializer(), trainable=False)
    u = tf.nn.embedding_lookup(user, features["user"] % 1000)
    i = tf.nn.embedding_lookup(item, features["item"] % 1000)
    logits = tf.matmul(tf.concat([u, i, u * i], axis=1), w)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        tf.reshape(labels, [-1, 1]), logits))
    step = v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, global_step=v1.train.get_or_create_global_step())
    rid = features["rid"]
    count = v1.scatter_add(seen, rid, tf.ones_like(rid, tf.int32))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.group(step, count))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch_size", type=int, default=64)
    args = ap.parse_args()
    ctx = program.context()
    with ShardingClient(ctx.master) as client:
        progress = client.progress(ctx.dataset).datasets[0]
        num_records, epochs = int(progress.records_per_epoch), int(progress.num_epochs)
    config = tf.estimator.RunConfig(model_dir=ctx.checkpoint_dir, save_checkpoints_secs=1,
                                    experimental_max_worker_delay_secs=0)
    estimator = tf.estimator.Estimator(model_fn, params={"num_records": num_records},
                                       config=config)
    if ctx.role == "ps":          # train_and_evaluate serves the PS until it is stopped
        unused = tf.estimator.TrainSpec(lambda: None), tf.estimator.EvalSpec(lambda: None)
        tf.estimator.train_and_evaluate(estimator, *unused)
        return
    feed = ShardFeed(ctx.master, ctx.dataset, args.batch_size,
                     record_format=TFRecordExamples(FEATURES))
    train_spec = tf.estimator.TrainSpec(feed.input_fn, hooks=feed.hooks(),
                                        saving_listeners=feed.saving_listeners())
    eval_spec = tf.estimator.EvalSpec(feed.input_fn, steps=1)
    tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    if ctx.index == 0:            # worker 0 is Estimator's chief
        counts = estimator.get_variable_value("seen")
        ctx.write_report({"batch_size": args.batch_size,
                          "audit": audit_summary(counts, epochs)})
    feed.close()


if __name__ == "__main__":
    program.run(main)
'''

PROGRAMS = {"keras": KERAS_PROGRAM, "custom_loop": CUSTOM_LOOP_PROGRAM, "mts": MTS_PROGRAM,
            "estimator": ESTIMATOR_PROGRAM}


def write_program(directory: pathlib.Path, api: str, name: str = "train.py") -> pathlib.Path:
    """The user's program for ``api`` in ``directory`` (created); its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(PROGRAMS[api]).lstrip())
    return path


def write_examples(path: pathlib.Path, first_rid: int, count: int, seed: int = 0) -> None:
    """The user's TFRecord data (keras_examples.clicks: tf.train.Examples with a
    learnable label and each record's own id)."""
    from keras_examples.clicks import write_examples as write

    write(path, first_rid, count, seed)
