"""The flags every chief binary of a PSS job shares (``antdt-coordinator``,
``antdt-keras-trainer``): where the cluster and the master are, what to train, the
report, checkpoints and the Monitor. Importing this module defines them (absl flags are
process-global, so each is defined once here, not once per binary).

Run as a job's program (``antdt-launch --program=antdt_tf.tf.coordinator``), a chief
takes the job's defaults from the program contract (``antdt_tf.program``: the master,
the dataset, checkpoints, the report path, the cluster in ``TF_CONFIG``), like any
user's program; its flags still win."""

from __future__ import annotations

import json
import os
import time

from absl import flags

from antdt_tf.program import ENV

FLAGS = flags.FLAGS


def _job(field: str, default):
    """The job's value of a contract field when this chief runs as a job's program."""
    value = os.environ.get(ENV[field])
    if value is None or value == "":
        return default
    if isinstance(default, bool):
        return value == "1"
    return type(default)(value) if default is not None else value


flags.DEFINE_string("cluster", "", "Cluster spec as JSON (needs a 'chief' job). Empty: "
                    "the cluster the master publishes (antdt-launch does), so a chief that "
                    "comes back after a task moved to another host gets its new address.")
flags.DEFINE_float("cluster_wait_seconds", 120.0, "Without --cluster: wait this long for "
                   "the master to have the job's cluster.")
flags.DEFINE_string("master", _job("master", None), "host:port of antdt-master.")
flags.DEFINE_string("dataset", _job("dataset", "train"), "Registered dataset to train.")
flags.DEFINE_integer("batch_size", 256, "Records per batch.")
flags.DEFINE_integer("buckets", 1 << 16, "Hash buckets of the embedding tables.")
flags.DEFINE_float("learning_rate", 0.2, "SGD learning rate of the model.")
flags.DEFINE_boolean("audit", _job("audit", False),
                     "Count per record how many times it was applied.")
flags.DEFINE_string("report_json", _job("report_json", ""), "Write the result report here.")
flags.DEFINE_string("checkpoint_dir", _job("checkpoint_dir", ""), "Checkpoint model (+ "
                    "optimizer) + sharding state here at step or shard boundaries; a "
                    "restarted chief restores all of it from the latest.")
flags.DEFINE_float("checkpoint_every_seconds", _job("checkpoint_every_seconds", 10.0),
                   "Checkpoint this often (the pull path and Keras: at a step boundary, "
                   "after draining the steps in flight).")
flags.DEFINE_string("eval_data", "", "A record file (.adtr) to compute the final AUC and "
                    "logloss on, after training (on the chief, reading the PS).")
flags.DEFINE_bool("sparse_reports", True, "Steps record how far each lease got on the PS, "
                  "and a lease is reported to the master when it is finished (the custom "
                  "loop: also at the end of each closure) instead of after every batch "
                  "(leases that may be stolen or backed up are still reported per batch); "
                  "the chief settles a dead worker's leases from the PS record. false: "
                  "report every batch.")
flags.DEFINE_float("report_seconds", 1.0, "How often per-worker numbers and PS probes go to "
                   "the master's ClusterMonitor (for the launcher's progress line and the "
                   "controller).")
flags.DEFINE_integer("worker_slots", _job("worker_slots", 0), "Worker slots the job may "
                     "scale to (sizes the "
                     "per-worker variables: counters, lease record); 0 = the workers in "
                     "--cluster.")
flags.DEFINE_integer("incarnation", -1, "This chief's incarnation for the master (-1: "
                     "milliseconds since the epoch, which grows with every relaunch).")


def chief_cluster() -> dict:
    """``--cluster``, or the job cluster the master publishes (``GetJobCluster``)."""
    from absl import app

    from antdt_tf.errors import AntdtError
    from antdt_tf.monitor.client import MonitorClient
    from antdt_tf.tf.cluster_spec import parse_chief_cluster_flag

    if FLAGS.cluster:
        return parse_chief_cluster_flag(FLAGS.cluster)
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    if tf_config.get("cluster", {}).get("chief"):     # run as a job's program
        return parse_chief_cluster_flag(json.dumps(tf_config["cluster"]))
    deadline = time.monotonic() + FLAGS.cluster_wait_seconds
    with MonitorClient(FLAGS.master) as monitor:
        while True:
            try:
                c = monitor.job_cluster()
                if c.version > 0:
                    return {"chief": list(c.chief), "ps": list(c.ps), "worker": list(c.worker)}
            except AntdtError:
                pass            # the master is restarting
            if time.monotonic() > deadline:
                raise app.UsageError(f"no --cluster, and the master at {FLAGS.master} had no "
                                     f"job cluster within {FLAGS.cluster_wait_seconds:g}s")
            time.sleep(0.2)


def chief_incarnation() -> int:
    """``--incarnation``, or milliseconds since the epoch."""
    return FLAGS.incarnation if FLAGS.incarnation >= 0 else int(time.time() * 1000)
