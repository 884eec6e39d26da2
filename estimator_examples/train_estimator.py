"""DeepFM trained with ``tf.estimator`` (TF 2.15 + tensorflow-estimator 2.15) on a PS
cluster, ``train_and_evaluate``-style: every task runs this program with its own
``TF_CONFIG`` (``chief``, ``worker``, ``ps``), and the data comes from the antdt-tf
master. The antdt-tf part is three lines, marked below::

    TF_CONFIG='{"cluster": {"chief": [...], "worker": [...], "ps": [...]},
                "task": {"type": "worker", "index": 0}}' \\
    python -m estimator_examples.train_estimator --master=127.0.0.1:7000 \\
        --data=train.adtr --model_dir=ckpt --audit

The chief registers the dataset, and after training writes the report (audit counts
from the final checkpoint, held-out AUC from a local ``predict``).
"""

from __future__ import annotations

import json
import os
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("master", None, "The antdt-tf master (host:port).")
flags.DEFINE_string("dataset", "train", "Dataset name on the master.")
flags.DEFINE_string("data", "", "Record file of the dataset (.adtr); the chief registers it.")
flags.DEFINE_integer("records_per_shard", 1024, "Chief: records per shard when registering.")
flags.DEFINE_integer("batch_size", 256, "Records per step.")
flags.DEFINE_integer("buckets", 1 << 14, "Hash buckets of each embedding table.")
flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate.")
flags.DEFINE_boolean("audit", False, "Count per record how often its gradient was applied.")
flags.DEFINE_string("model_dir", None, "Checkpoints (model + sharding state).")
flags.DEFINE_integer("save_secs", 2, "Seconds between checkpoints.")
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


def model_fn(features, labels, mode, params):
    import tensorflow as tf

    from estimator_examples.deepfm_tf1 import deepfm_logits, deepfm_train_op

    if mode == tf.estimator.ModeKeys.PREDICT:
        logits = deepfm_logits(features["dense"], features["sparse"], params["num_ps"],
                               params["buckets"])
        return tf.estimator.EstimatorSpec(mode, predictions={"p": tf.sigmoid(logits)})
    loss, train_op = deepfm_train_op(features, labels, params["num_ps"], params["buckets"],
                                     params["learning_rate"], params["audit_records"])
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster, task = tf_config.get("cluster", {}), tf_config.get("task", {})
    if not cluster.get("ps") or task.get("type") not in ("chief", "worker", "ps"):
        raise app.UsageError("TF_CONFIG must name a cluster with ps tasks and this task "
                             "(chief, worker or ps)")
    if not FLAGS.master or not FLAGS.model_dir or not FLAGS.data:
        raise app.UsageError("--master, --model_dir and --data are required")
    import tensorflow as tf

    from antdt_tf.data import metrics
    from antdt_tf.data.records import RecordFile
    from antdt_tf.estimator import ShardFeed
    from antdt_tf.sharding.client import ShardingClient, worker_split
    from antdt_tf.sharding.plan import DataFile, DatasetSpec

    if FLAGS.standby_file:
        from antdt_tf.procutil import stand_by

        stand_by(FLAGS.standby_file, cluster[task["type"]][task.get("index", 0)], 120,
                 f"{task['type']}:{task.get('index', 0)}")
    chief = task["type"] == "chief"
    num_records = RecordFile(FLAGS.data).num_records
    if chief and FLAGS.register:   # (any task could: the same spec again changes nothing)
        with ShardingClient(FLAGS.master) as admin:
            admin.register_dataset(DatasetSpec(FLAGS.dataset, records_per_shard=FLAGS.records_per_shard,
                                               files=(DataFile(FLAGS.data, num_records),)))
    params = {"num_ps": len(cluster["ps"]), "buckets": FLAGS.buckets,
              "learning_rate": FLAGS.learning_rate,
              "audit_records": num_records if FLAGS.audit else 0}
    config = tf.estimator.RunConfig(model_dir=FLAGS.model_dir,
                                    save_checkpoints_secs=FLAGS.save_secs,
                                    experimental_max_worker_delay_secs=0)
    estimator = tf.estimator.Estimator(model_fn, params=params, config=config)
    if task["type"] == "ps":      # train_and_evaluate serves the PS until it is killed
        unused = tf.estimator.TrainSpec(lambda: None), tf.estimator.EvalSpec(lambda: None)
        tf.estimator.train_and_evaluate(estimator, *unused)
        return
    # --- the antdt-tf lines ----------------------------------------------------------
    feed = ShardFeed(FLAGS.master, FLAGS.dataset, FLAGS.batch_size,
                     sparse_reports=FLAGS.sparse_reports)
    train_spec = tf.estimator.TrainSpec(feed.input_fn, hooks=feed.hooks(),
                                        saving_listeners=feed.saving_listeners())
    # ----------------------------------------------------------------------------------
    eval_spec = tf.estimator.EvalSpec(feed.input_fn, steps=1)   # no evaluator task here
    t0 = time.monotonic()
    tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    hook = train_spec.hooks[0]
    report = {"task": f"{task['type']}:{task.get('index', 0)}", "worker": feed.worker,
              "train_seconds": round(time.monotonic() - t0, 3), "steps": hook.steps,
              "records": hook.records, "refused_reports": hook.refused, "reports": hook.reports,
              "first_step_unix": hook.first_step_unix, "last_step_unix": hook.last_step_unix}
    if not chief:
        print(json.dumps(report), flush=True)
        return
    saver = feed.state_saver
    report.update(checkpoints_with_state=saver.saves, restored_sharding_state=saver.restored,
                  settled_held_leases=feed.settle_hook.settled if feed.settle_hook else 0)
    if FLAGS.audit:
        report["audit"] = metrics.audit_summary(estimator.get_variable_value("antdt_audit"), 1)
    if FLAGS.eval_data:
        held_out = RecordFile(FLAGS.eval_data)
        b = held_out.read(0, held_out.num_records)
        del os.environ["TF_CONFIG"]        # predict in this process, not on the cluster
        local = tf.estimator.Estimator(model_fn, params=params, config=tf.estimator.RunConfig(
            model_dir=FLAGS.model_dir))
        probs = [p["p"] for p in local.predict(lambda: tf.data.Dataset.from_tensor_slices(
            {"dense": b.dense, "sparse": b.sparse}).batch(4096))]
        report.update(eval_records=len(probs), auc=metrics.auc(b.label, probs),
                      logloss=metrics.logloss(b.label, probs))
    with ShardingClient(FLAGS.master) as admin:
        p = admin.progress(FLAGS.dataset)
        report["shards_per_worker"], report["records_per_worker"] = worker_split(p)
        report["records_done"] = p.datasets[0].records_done_total
    metrics.write_report(report, FLAGS.report_json)
    feed.close()


def run():
    app.run(main)


if __name__ == "__main__":
    run()
