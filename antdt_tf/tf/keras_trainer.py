"""antdt-keras-trainer: the chief of a PSS job trained with tf-keras ``model.fit``.

The Keras counterpart of ``antdt-coordinator`` (same flags, same report, same exit
codes: 0 done, 75 a cluster task is unavailable — relaunch once it is back, 1 other):
builds ``ParameterServerStrategy``, the Keras DeepFM, and runs ``model.fit`` on
:func:`antdt_tf.tf.keras.dataset_creator` with a :class:`~antdt_tf.tf.keras.ShardingCallback`.
It is also a complete example of the Keras integration (docs/keras.md).
"""

from __future__ import annotations

import logging
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"   # before TensorFlow is imported: tf.keras = tf-keras

from absl import flags  # noqa: E402

from antdt_tf import exitcodes  # noqa: E402
from antdt_tf.tf import chief_flags  # noqa: E402
from antdt_tf.tf.cluster_spec import make_strategy  # noqa: E402

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(chief_flags)   # --helpshort lists the shared flags
flags.DEFINE_integer("steps_per_execution", 16, "Training steps per scheduled closure "
                     "(model.compile's steps_per_execution). Each closure pays a fixed cost, "
                     "so 16 is faster than 1 (the comparison job: 4.4 s vs 6.0 s); a worker "
                     "SIGKILL repeats at most one batch at either (docs/keras.md).")


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = chief_flags.chief_cluster()
    import tensorflow as tf

    from antdt_tf.models.keras_deepfm import build_keras_deepfm
    from antdt_tf.sharding.client import ShardingClient
    from antdt_tf.tf import keras as antdt_keras
    from antdt_tf.procutil import exit_now

    def _leave(code, message=""):
        exit_now(code, message, "antdt-keras-trainer")

    keras = tf.keras
    client = ShardingClient(FLAGS.master)
    progress = client.progress(FLAGS.dataset).datasets[0]
    strategy = make_strategy(spec)
    with strategy.scope():
        model = build_keras_deepfm(FLAGS.buckets)
        model.compile(optimizer=keras.optimizers.SGD(FLAGS.learning_rate),
                      loss=keras.losses.BinaryCrossentropy(),
                      steps_per_execution=FLAGS.steps_per_execution)
    sharding = antdt_keras.ShardingCallback(
        FLAGS.master, FLAGS.dataset, checkpoint_dir=FLAGS.checkpoint_dir,
        checkpoint_every_seconds=FLAGS.checkpoint_every_seconds,
        audit_records=progress.records_per_epoch if FLAGS.audit else 0,
        sparse_reports=FLAGS.sparse_reports, worker_slots=FLAGS.worker_slots)
    model = sharding.attach(model)          # the step that reports to the master
    report = {"restored_from": sharding.restore_or_initialize(model)}
    import time

    from antdt_tf.tf.ps_probe import PsProbe

    incarnation = chief_flags.chief_incarnation()
    monitor = antdt_keras.ClusterMonitorCallback(
        FLAGS.master, FLAGS.dataset, PsProbe(strategy, len(spec["ps"])), incarnation,
        report_seconds=FLAGS.report_seconds, client=client)
    t0 = time.monotonic()
    try:
        model.fit(antdt_keras.dataset_creator(FLAGS.master, FLAGS.dataset, FLAGS.batch_size,
                                              sparse_reports=FLAGS.sparse_reports,
                                              steps_per_execution=FLAGS.steps_per_execution),
                  epochs=1, steps_per_epoch=sharding.steps_upper_bound(FLAGS.batch_size),
                  callbacks=[sharding, monitor], verbose=0)
    except tf.errors.UnavailableError as e:
        _leave(exitcodes.CLUSTER_UNAVAILABLE, f"cluster task unavailable, relaunch me: {e}")
    except Exception as e:  # the binary's top level: report, then leave
        logging.exception("training failed")
        _leave(1, f"training failed: {type(e).__name__}: {e}")
    final = client.progress(FLAGS.dataset)
    workers = sorted((t for t in final.tasks if t.task.type == "worker"),
                     key=lambda t: t.task.index)
    report.update(records=int(final.datasets[0].records_done_total),
                  shards=int(final.datasets[0].shards_per_epoch * final.datasets[0].num_epochs),
                  seconds=time.monotonic() - t0, api="keras",
                  sparse_reports=FLAGS.sparse_reports, settled_held_leases=sharding.settled,
                  shards_per_worker=[int(t.shards_done) for t in workers],
                  records_per_worker=[int(t.records_done) for t in workers])
    if FLAGS.audit:
        counts = sharding.applied_counts()
        expected = progress.num_epochs
        from antdt_tf.data.metrics import audit_summary

        report["audit"] = audit_summary(counts, expected, started=sharding.started_counts())
    if FLAGS.eval_data:
        report.update(evaluate(tf, model, FLAGS.eval_data))
    from antdt_tf.data.metrics import write_report

    write_report(report, FLAGS.report_json)
    _leave(0)


def evaluate(tf, model, path: str, batch: int = 8192) -> dict:
    from antdt_tf.data.metrics import evaluate_file

    return evaluate_file(path, lambda b: model(
        {"dense": tf.constant(b.dense), "sparse": tf.constant(b.sparse)}, training=False),
        batch)


def run():
    flags.mark_flags_as_required(["master"])
    from antdt_tf import exitcodes

    exitcodes.run(main, "antdt-keras-trainer")


if __name__ == "__main__":
    run()
