"""antdt-coordinator: the chief process of a PSS job trained through the master.

Usage::

    python -m antdt_tf.tf.coordinator --cluster='{"chief": [...], "ps": [...], "worker": [...]}'
        --master=127.0.0.1:7470 --dataset=train --batch_size=256 [--audit] [--report_json=r.json]

Builds ``ParameterServerStrategy`` (embeddings partitioned over the PS tasks) and a
``ClusterCoordinator``, then runs :class:`~antdt_tf.tf.trainer.ShardTrainer` until the
master says END, and writes a JSON report (records, shards, seconds and, with
``--audit``, how many records were applied 0, 1 and 2+ times).

Exit codes: 0 done; 75 a cluster task (e.g. a PS) became unavailable — relaunch after
it is back, the checkpoint restores model and sharding state; 1 any other failure.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from absl import app, flags

from antdt_tf.tf.cluster_spec import parse_cluster_flag

FLAGS = flags.FLAGS
EXIT_CLUSTER_UNAVAILABLE = 75  # EX_TEMPFAIL: relaunch when the cluster is whole again
flags.DEFINE_string("cluster", None, "Cluster spec as JSON (needs a 'chief' job).")
flags.DEFINE_string("master", None, "host:port of antdt-master.")
flags.DEFINE_string("dataset", "train", "Registered dataset to train.")
flags.DEFINE_integer("batch_size", 256, "Records per batch.")
flags.DEFINE_integer("buckets", 1 << 16, "Hash buckets of the embedding tables.")
flags.DEFINE_boolean("audit", False, "Count per record how many times it was applied.")
flags.DEFINE_string("report_json", "", "Write the result report here.")
flags.DEFINE_string("checkpoint_dir", "", "Checkpoint model + sharding state here at shard "
                    "boundaries; a restarted coordinator restores both from the latest.")
flags.DEFINE_integer("checkpoint_every_shards", 8, "Checkpoint after this many DONE shards.")
flags.DEFINE_integer("incarnation", -1, "This coordinator's incarnation for the master "
                     "(-1: milliseconds since the epoch, which grows with every relaunch).")


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = parse_cluster_flag(FLAGS.cluster)
    for job in ("chief", "ps", "worker"):
        if not spec.get(job):
            raise app.UsageError(f"the cluster spec needs a {job!r} job")
    import tensorflow as tf

    from antdt_tf.models.deepfm import DeepFM
    from antdt_tf.sharding.client import ShardingClient, Task
    from antdt_tf.tf.checkpoint import ShardingCheckpoint
    from antdt_tf.tf.trainer import ShardTrainer

    incarnation = FLAGS.incarnation if FLAGS.incarnation >= 0 else int(time.time() * 1000)
    client = ShardingClient(FLAGS.master, Task("chief", 0, incarnation))
    progress = client.progress(FLAGS.dataset).datasets[0]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    # Large tables are split over every PS; small variables stay whole.
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.
        MinSizePartitioner(min_shard_bytes=64 << 10, max_shards=len(spec["ps"])))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    audit_records = progress.records_per_epoch if FLAGS.audit else 0
    with strategy.scope():
        model = DeepFM(buckets=FLAGS.buckets, audit_records=audit_records)
    report = {}
    on_checkpoint = None
    if FLAGS.checkpoint_dir:
        ckpt = ShardingCheckpoint(FLAGS.checkpoint_dir, model, client, [FLAGS.dataset])
        restored = ckpt.restore_or_initialize()
        report["restored_from"] = restored or ""
        on_checkpoint = ckpt.save
    trainer = ShardTrainer(strategy, coordinator, client, FLAGS.dataset, model.train_step,
                           FLAGS.batch_size, num_workers=len(spec["worker"]),
                           task=client.task, checkpoint_every_shards=FLAGS.checkpoint_every_shards,
                           on_checkpoint=on_checkpoint)
    try:
        result = trainer.train()
    except tf.errors.UnavailableError as e:
        # A PS (or every worker) is gone: this strategy cannot continue. Exit with
        # EX_TEMPFAIL so the supervisor relaunches once the task is back; the relaunch
        # restores model and sharding state from the last shard-boundary checkpoint.
        _leave(EXIT_CLUSTER_UNAVAILABLE, f"cluster task unavailable, relaunch me: {e}")
    except Exception as e:  # the binary's top level: report, then leave (see _leave)
        logging.exception("training failed")
        _leave(1, f"training failed: {type(e).__name__}: {e}")
    report.update(records=result.records, shards=result.shards, seconds=result.seconds,
                  shards_per_worker=result.shards_per_worker,
                  records_per_worker=result.records_per_worker)
    if audit_records:
        counts = model.applied.numpy() if not hasattr(model.applied, "variables") else \
            tf.concat([v.read_value() for v in model.applied.variables], 0).numpy()
        report["audit"] = {"applied_0": int((counts == 0).sum()),
                           "applied_1": int((counts == 1).sum()),
                           "applied_2plus": int((counts >= 2).sum())}
    text = json.dumps(report)
    print(text, flush=True)
    if FLAGS.report_json:
        with open(FLAGS.report_json, "w") as f:
            f.write(text)
    _leave(0)


def _leave(code: int, message: str = "") -> None:
    """Exits now. ClusterCoordinator's destructor waits for every failed task to come
    back (its failure handler keeps reconnecting), so a job that lost a task would
    never exit normally; everything worth keeping is reported by then."""
    if message:
        print(f"antdt-coordinator: {message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run():
    flags.mark_flags_as_required(["cluster", "master"])
    app.run(main)


if __name__ == "__main__":
    run()
