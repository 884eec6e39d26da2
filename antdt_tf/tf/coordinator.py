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

import logging
import os

from absl import flags

from antdt_tf import exitcodes
from antdt_tf.tf import chief_flags
from antdt_tf.tf.cluster_spec import make_strategy

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(chief_flags)   # --helpshort lists the shared flags
flags.DEFINE_enum("data_path", "pull", ["pull", "closure"], "pull: each worker's tf.data "
                  "pipeline leases shards from the master itself (many steps per closure); "
                  "closure: the coordinator leases shards and schedules one closure per shard.")
flags.DEFINE_enum("mode", "async", ["async", "bsp"], "async: every worker applies its own "
                  "steps to the PS (PSS's default). bsp: synchronous rounds, one batch per "
                  "worker, applied together by the chief (see antdt_tf.tf.bsp); pull data "
                  "path only.")
flags.DEFINE_integer("max_batch_size", 0, "bsp: the largest batch one worker may stage "
                     "(0: the global batch, num_workers * batch_size).")
flags.DEFINE_integer("steps_per_closure", 16, "pull: training steps per scheduled closure.")
flags.DEFINE_integer("checkpoint_every_shards", 8, "closure: checkpoint after this many DONE "
                     "shards.")
flags.DEFINE_string("tensorboard_dir", "", "Write the Monitor's view (per-worker BPT, "
                    "records/s, slowness, straggler class; per-PS latency) as TensorBoard "
                    "scalars here, every --report_seconds.")


def main(argv):
    del argv
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    spec = chief_flags.chief_cluster()
    import tensorflow as tf

    from antdt_tf.models.deepfm import DeepFM
    from antdt_tf.sharding.client import ShardingClient, Task
    from antdt_tf.tf.checkpoint import ShardingCheckpoint
    from antdt_tf.tf.trainer import ShardTrainer

    incarnation = chief_flags.chief_incarnation()
    client = ShardingClient(FLAGS.master, Task("chief", 0, incarnation))
    progress = client.progress(FLAGS.dataset).datasets[0]
    strategy = make_strategy(spec)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    audit_records = progress.records_per_epoch if FLAGS.audit else 0
    with strategy.scope():
        model = DeepFM(buckets=FLAGS.buckets, audit_records=audit_records,
                       learning_rate=FLAGS.learning_rate)
    from antdt_tf.monitor.client import MonitorClient

    monitor = MonitorClient(FLAGS.master)
    from antdt_tf.tf.ps_probe import PsProbe

    probe = PsProbe(strategy, len(spec["ps"]))
    board = MonitorScalars(FLAGS.tensorboard_dir) if FLAGS.tensorboard_dir else None

    def report_workers(shards, records):
        try:
            monitor.report_trainer(incarnation, list(zip(shards, records)),
                                   ps_latency_ms=probe.measure())
        except Exception as e:  # progress reports are best effort; training goes on
            logging.warning("per-worker report not delivered: %s", e)
        if board is not None:
            try:
                board.write(monitor.status(), sum(records))
            except Exception as e:  # scalars are best effort too
                logging.warning("TensorBoard scalars not written: %s", e)

    if FLAGS.mode == "bsp":
        if FLAGS.data_path != "pull":
            _leave(2, "--mode=bsp needs --data_path=pull")
        from antdt_tf.tf.bsp import SyncRoundTrainer

        trainer = SyncRoundTrainer(
            strategy, coordinator, FLAGS.master, FLAGS.dataset, model, FLAGS.batch_size,
            num_workers=len(spec["worker"]),
            progress_fn=lambda: client.progress(FLAGS.dataset).datasets[0], reporter=client,
            max_batch_size=FLAGS.max_batch_size,
            checkpoint_every_seconds=FLAGS.checkpoint_every_seconds,
            on_progress=report_workers, progress_seconds=FLAGS.report_seconds,
            worker_slots=FLAGS.worker_slots)
    elif FLAGS.data_path == "pull":
        from antdt_tf.tf.pull import PullTrainer

        trainer = PullTrainer(
            strategy, coordinator, FLAGS.master, FLAGS.dataset, model.train_step,
            FLAGS.batch_size, num_workers=len(spec["worker"]),
            progress_fn=lambda: client.progress(FLAGS.dataset).datasets[0],
            steps_per_closure=FLAGS.steps_per_closure,
            checkpoint_every_seconds=FLAGS.checkpoint_every_seconds,
            on_progress=report_workers, progress_seconds=FLAGS.report_seconds,
            worker_slots=FLAGS.worker_slots,
            record_fn=client.apply_lease_record if FLAGS.sparse_reports else None)
    else:
        trainer = ShardTrainer(
            strategy, coordinator, client, FLAGS.dataset, model.train_step, FLAGS.batch_size,
            num_workers=len(spec["worker"]), task=client.task,
            checkpoint_every_shards=FLAGS.checkpoint_every_shards,
            on_progress=report_workers, progress_seconds=FLAGS.report_seconds)
    report = {}
    if FLAGS.checkpoint_dir:
        ckpt = ShardingCheckpoint(FLAGS.checkpoint_dir, model, client, [FLAGS.dataset],
                                  trainer=trainer.counters)
        restored = ckpt.restore_or_initialize()
        report["restored_from"] = restored or ""
        trainer.on_checkpoint = ckpt.save
    try:
        result = trainer.train()
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
        # A PS (or every worker) is gone — or was replaced: a PS that came back at its
        # address (ReplacePs) answers with AbortedError "expects a different device
        # incarnation". This strategy cannot continue. Exit with EX_TEMPFAIL so the
        # supervisor relaunches once the task is back; the relaunch restores model and
        # sharding state from the last shard-boundary checkpoint.
        _leave(exitcodes.CLUSTER_UNAVAILABLE, f"cluster task unavailable, relaunch me: {e}")
    except Exception as e:  # the binary's top level: report, then leave (see _leave)
        logging.exception("training failed")
        _leave(1, f"training failed: {type(e).__name__}: {e}")
    if FLAGS.mode == "bsp":
        report.update(rounds=trainer.rounds, refused_reports=trainer.refused_reports,
                      batch_sizes_seen={w: dict(c) for w, c in trainer.batch_sizes_seen.items()})
    report.update(mode=FLAGS.mode,
                  records=result.records, shards=result.shards, seconds=result.seconds,
                  shards_per_worker=result.shards_per_worker,
                  records_per_worker=result.records_per_worker,
                  worker_last_step_unix=getattr(result, "last_step_unix", []))
    if audit_records:
        from antdt_tf.tf.variables import full_value

        counts = full_value(model.applied).numpy()
        expected = progress.num_epochs   # every record once per epoch
        from antdt_tf.data.metrics import audit_summary

        report["audit"] = audit_summary(counts, expected)
    if FLAGS.eval_data:
        report.update(evaluate(tf, model, FLAGS.eval_data))
    from antdt_tf.data.metrics import write_report

    write_report(report, FLAGS.report_json)
    _leave(0)


class MonitorScalars:
    """The Monitor's judgement as TensorBoard scalars, stepped by records trained.

    Written with ``tf.summary.write`` and the scalars plugin's metadata (what
    ``tf.summary.scalar`` does), so no ``tensorboard`` package is needed to write them."""

    def __init__(self, logdir: str):
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        self._tf = tf
        self._writer = tf.summary.create_file_writer(logdir)
        self._metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
        ).SerializeToString()

    def _scalar(self, tag: str, value: float) -> None:
        self._tf.summary.write(tag, self._tf.constant(float(value), self._tf.float32),
                               metadata=self._metadata)

    def write(self, status, step: int) -> None:
        with self._writer.as_default(step=step):
            for h in status.health:
                name = f"monitor/{h.task.job}{h.task.index}"
                self._scalar(f"{name}/straggler_class", h.straggler_class)
                self._scalar(f"{name}/slowness", h.slowness)
                if h.task.job == "worker":
                    self._scalar(f"{name}/bpt_seconds", h.step_seconds)
                    self._scalar(f"{name}/records_per_second", h.records_per_second)
                else:
                    self._scalar(f"{name}/latency_ms", h.latency_ms)
            for w in status.trainer.workers:
                self._scalar(f"trainer/worker{w.worker}/records", w.records)
        self._writer.flush()


def evaluate(tf, model, path: str, batch: int = 8192) -> dict:
    """AUC and logloss of the trained model on a record file, computed here with the
    model's variables read from the PS."""
    import numpy as np

    from antdt_tf.data.metrics import evaluate_file
    from antdt_tf.models.deepfm import DeepFM
    from antdt_tf.tf.variables import full_value

    # Evaluate a local copy: a tf.function over the PS-resident (sharded) variables,
    # called on the coordinator outside schedule(), gave chance-level predictions here
    # (TF 2.21), while the same weights copied out score as expected.
    local = DeepFM(buckets=model.buckets)
    for name in ("embedding", "linear", "w1", "b1", "w2", "bias"):
        getattr(local, name).assign(full_value(getattr(model, name)))
    logits = tf.function(local.predict_logits)

    def predict(b):
        out = logits({"label": tf.constant(b.label), "dense": tf.constant(b.dense),
                      "sparse": tf.constant(b.sparse)})
        return 1 / (1 + np.exp(-out.numpy()))

    return evaluate_file(path, predict, batch)


def _leave(code: int, message: str = "") -> None:
    from antdt_tf.procutil import exit_now

    exit_now(code, message, "antdt-coordinator")


def run():
    flags.mark_flags_as_required(["master"])
    exitcodes.run(main, "antdt-coordinator")


if __name__ == "__main__":
    run()
