"""antdt-tf-server: one TensorFlow server task (ps or worker) of a PSS cluster.

Usage: python -m antdt_tf.tf.server --cluster='{"chief": [...], "ps": [...], "worker": [...]}'
       --job=worker --index=0

The process an agent starts, stops and kills for every ps/worker task. It serves until
killed; it holds no state of its own that a restart would lose (PS variables are
restored from checkpoints by the coordinator).

``--standby_file=F``: for moving a task to another host with the shortest gap. The new
process imports TensorFlow (seconds), writes F, then waits for the task's address to
become free and binds it at once; the controller kills the old process only after F
appeared. The chief's reconnect then finds the task back within a fraction of a second
instead of after TensorFlow's start-up plus gRPC's reconnect back-off.
"""

from __future__ import annotations

import os

from absl import app, flags

from antdt_tf.procutil import stand_by
from antdt_tf.tf.cluster_spec import parse_cluster_flag

FLAGS = flags.FLAGS
flags.DEFINE_string("cluster", None, "Cluster spec as JSON: job name -> list of host:port.")
flags.DEFINE_enum("job", None, ["ps", "worker"], "This task's job.")
flags.DEFINE_integer("index", 0, "This task's index in its job.")
flags.DEFINE_string("standby_file", "", "Standby mode: write this file once ready, then wait "
                    "until the task's address is free (its old process killed) and serve.")
flags.DEFINE_float("standby_seconds", 120.0, "Standby mode: give up (exit 1) after this long.")


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = parse_cluster_flag(FLAGS.cluster)
    if FLAGS.job not in spec or not 0 <= FLAGS.index < len(spec[FLAGS.job]):
        raise app.UsageError(f"task {FLAGS.job}:{FLAGS.index} is not in the cluster spec")
    import tensorflow as tf  # after flag checks: importing TF takes seconds

    if FLAGS.standby_file:
        stand_by(FLAGS.standby_file, spec[FLAGS.job][FLAGS.index], FLAGS.standby_seconds,
                 f"{FLAGS.job}:{FLAGS.index}")
    try:
        server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=FLAGS.job,
                                      task_index=FLAGS.index, protocol="grpc", start=True)
    except tf.errors.UnknownError as e:     # TF says only "Could not start gRPC server"
        from antdt_tf import exitcodes

        return exitcodes.error("antdt-tf-server", f"{FLAGS.job}:{FLAGS.index} cannot serve "
                               f"on {spec[FLAGS.job][FLAGS.index]} (the port is in use or "
                               f"the address is not on this host): {e.message}",
                               exitcodes.CANNOT_SERVE)
    print(f"[{FLAGS.job}:{FLAGS.index}] serving {server.target}", flush=True)
    server.join()


def run():
    flags.mark_flags_as_required(["cluster", "job"])
    from antdt_tf import exitcodes

    exitcodes.run(main, "antdt-tf-server")


if __name__ == "__main__":
    run()
