"""DeepFM trained TF1-style on TF 2.21: between-graph replication with
``tf.compat.v1.train.MonitoredTrainingSession``, data from the antdt-tf master.

One process per worker task (its own ``tf.distribute.Server`` plus the training client);
PS tasks are plain servers (``python -m antdt_tf.tf.server --job=ps``). Worker 0 is the
chief: it registers the dataset, writes checkpoints that carry the sharding state, and
at the end writes the report (audit counts, held-out AUC)::

    python -m estimator_examples.train_mts --cluster='{"ps": [...], "worker": [...]}' \\
        --task_index=0 --master=127.0.0.1:7000 --data=train.adtr --audit

The antdt-tf lines are the ``ShardFeed`` ones: input, hooks, chief hooks.
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags

from antdt_tf.tf.cluster_spec import parse_cluster_flag

FLAGS = flags.FLAGS
flags.DEFINE_string("cluster", None, 'Cluster spec JSON: {"ps": [...], "worker": [...]}.')
flags.DEFINE_integer("task_index", 0, "This worker's index (0 = chief).")
flags.DEFINE_string("master", None, "The antdt-tf master (host:port).")
flags.DEFINE_string("dataset", "train", "Dataset name on the master.")
flags.DEFINE_string("data", "", "Chief: record file to register as the dataset (.adtr).")
flags.DEFINE_integer("records_per_shard", 1024, "Chief: records per shard when registering.")
flags.DEFINE_integer("batch_size", 256, "Records per step.")
flags.DEFINE_integer("buckets", 1 << 14, "Hash buckets of each embedding table.")
flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate.")
flags.DEFINE_boolean("audit", False, "Count per record how often its gradient was applied.")
flags.DEFINE_integer("audit_records", 0, "Records in the dataset (with --audit; default: "
                     "read from --data).")
flags.DEFINE_string("checkpoint_dir", "", "Chief: checkpoints (model + sharding state).")
flags.DEFINE_float("save_secs", 2.0, "Chief: seconds between checkpoints.")
flags.DEFINE_string("eval_data", "", "Chief: held-out record file for the final AUC.")
flags.DEFINE_string("report_json", "", "Chief: write the JSON report here.")
flags.DEFINE_boolean("sparse_reports", True, "Report a lease when it is finished (steps record "
                     "their position on the PS; the chief settles dead workers' leases) "
                     "instead of after every step.")
flags.DEFINE_string("standby_file", "", "Moving to another host (antdt-launch's RelaunchWorker): "
                    "import TensorFlow, write this file, wait until the task's address is "
                    "free (its old process killed), then serve and train.")
flags.DEFINE_boolean("register", True, "Chief: register --data as the dataset (antdt-launch "
                     "registers it itself and passes --noregister).")


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = parse_cluster_flag(FLAGS.cluster)
    if not spec.get("ps") or not spec.get("worker"):
        raise app.UsageError("--cluster needs a ps and a worker job")
    if not 0 <= FLAGS.task_index < len(spec["worker"]):
        raise app.UsageError(f"--task_index={FLAGS.task_index} is not a worker of the cluster")
    if not FLAGS.master:
        raise app.UsageError("--master is required")
    import tensorflow as tf

    from antdt_tf.data import metrics
    from antdt_tf.data.records import RecordFile
    from antdt_tf.estimator import ShardFeed
    from antdt_tf.sharding.client import ShardingClient, worker_split
    from antdt_tf.sharding.plan import DataFile, DatasetSpec
    from estimator_examples.deepfm_tf1 import audit_variable, deepfm_logits, deepfm_train_op

    v1 = tf.compat.v1
    i, chief = FLAGS.task_index, FLAGS.task_index == 0
    cluster = tf.train.ClusterSpec(spec)
    if FLAGS.standby_file:
        from antdt_tf.procutil import stand_by

        stand_by(FLAGS.standby_file, spec["worker"][i], 120, f"worker:{i}")
    server = tf.distribute.Server(cluster, job_name="worker", task_index=i, start=True)
    v1.disable_eager_execution()
    audit_records = 0
    if FLAGS.audit:
        audit_records = FLAGS.audit_records or RecordFile(FLAGS.data).num_records
    if chief and FLAGS.data and FLAGS.register:
        with ShardingClient(FLAGS.master) as admin:
            admin.register_dataset(DatasetSpec(
                FLAGS.dataset, records_per_shard=FLAGS.records_per_shard,
                files=(DataFile(FLAGS.data, RecordFile(FLAGS.data).num_records),)))

    # --- the antdt-tf lines -------------------------------------------------------
    feed = ShardFeed(FLAGS.master, FLAGS.dataset, FLAGS.batch_size, worker=i,
                     worker_device=f"/job:worker/task:{i}", sparse_reports=FLAGS.sparse_reports)
    with v1.device(v1.train.replica_device_setter(
            cluster=cluster, worker_device=f"/job:worker/task:{i}")):
        features, labels = feed.input_fn()
        loss, train_op = deepfm_train_op(features, labels, len(spec["ps"]), FLAGS.buckets,
                                         FLAGS.learning_rate, audit_records)
        if chief and FLAGS.eval_data:
            dense = v1.placeholder(tf.float32, [None, 13])
            sparse = v1.placeholder(tf.int64, [None, 26])
            prob = tf.sigmoid(deepfm_logits(dense, sparse, len(spec["ps"]), FLAGS.buckets))
    hooks = feed.hooks()
    chief_hooks = feed.chief_hooks(FLAGS.checkpoint_dir, save_secs=FLAGS.save_secs) \
        if chief and FLAGS.checkpoint_dir else []
    # ------------------------------------------------------------------------------
    config = v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{i}"])
    t0 = time.monotonic()
    with v1.train.MonitoredTrainingSession(
            master=server.target, is_chief=chief,
            checkpoint_dir=FLAGS.checkpoint_dir or None, save_checkpoint_secs=None,
            save_checkpoint_steps=None, save_summaries_steps=None, save_summaries_secs=None,
            log_step_count_steps=None, hooks=hooks, chief_only_hooks=chief_hooks,
            config=config) as sess:
        ready = time.monotonic() - t0
        try:
            while not sess.should_stop():
                sess.run(train_op)
        except tf.errors.OutOfRangeError:
            pass     # the master has no more data (MonitoredSession raises it from run)
        report_hook = hooks[0]
        # this worker's steps, at once: the launcher stops the others when the chief is done
        print(json.dumps({"worker": i, "first_step_unix": report_hook.first_step_unix,
                          "last_step_unix": report_hook.last_step_unix}), flush=True)
    report = {"worker": i, "session_ready_seconds": round(ready, 3),
              "train_seconds": round(time.monotonic() - t0, 3), "steps": report_hook.steps,
              "records": report_hook.records, "refused_reports": report_hook.refused,
              "reports": report_hook.reports,
              "step_seconds": round(report_hook.step_seconds, 3),
              "first_step_unix": report_hook.first_step_unix,
              "last_step_unix": report_hook.last_step_unix}
    if chief:
        saver = feed.state_saver
        report.update(checkpoints_with_state=saver.saves if saver else 0,
                      restored_sharding_state=bool(saver and saver.restored),
                      settled_held_leases=feed.settle_hook.settled if feed.settle_hook else 0)
        with v1.Session(server.target, config=config) as s:
            if audit_records:
                report["audit"] = metrics.audit_summary(s.run(audit_variable()), 1)
            if FLAGS.eval_data:
                report.update(metrics.evaluate_file(
                    FLAGS.eval_data, lambda b: s.run(prob, {dense: b.dense, sparse: b.sparse})))
        with ShardingClient(FLAGS.master) as admin:
            p = admin.progress(FLAGS.dataset)
            report["shards_per_worker"], report["records_per_worker"] = worker_split(p)
            report["records_done"] = p.datasets[0].records_done_total
        metrics.write_report(report, FLAGS.report_json)
    else:
        print(json.dumps(report), flush=True)
    feed.close()


def run():
    flags.mark_flags_as_required(["cluster", "master"])
    app.run(main)


if __name__ == "__main__":
    run()
