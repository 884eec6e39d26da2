"""SessionRunHooks that connect a TF1 worker (``MonitoredTrainingSession`` or
``tf.estimator``) to the master: report what each step trained, and keep the sharding
state inside the chief's checkpoints.
"""

from __future__ import annotations

import logging
import time

import tensorflow as tf

from antdt_tf.estimator.feed import META_COLLECTION, ShardFeed
from antdt_tf.sharding.client import ShardingClient

log = logging.getLogger(__name__)


class ShardReportHook(tf.compat.v1.train.SessionRunHook):
    """After every step: tells the master how far the trained batch's lease got.

    ``after_run`` runs once the step's updates were applied on the PS (the session run
    returned), so a worker killed at any moment loses at most the batch it was training
    and has reported nothing it did not apply — the same bound as the TF2 path. A
    refused report (the lease was stolen or expired) makes the feed skip the rest of
    that lease. The master's Monitor times these reports (BPT) per worker; the hook
    also keeps its own step times (``step_seconds``)."""

    def __init__(self, feed: ShardFeed):
        self.feed = feed
        self.steps = 0
        self.records = 0
        self.refused = 0
        self.step_seconds = 0.0     # wall time inside session.run, summed
        self._meta = None
        self._t0 = 0.0

    def begin(self):
        meta = tf.compat.v1.get_collection(META_COLLECTION)
        if len(meta) != 6 or self.feed.refused_lease is None:
            raise ValueError("ShardReportHook needs the graph built by ShardFeed.input_fn "
                             f"(found {len(meta)} lease tensors in {META_COLLECTION!r})")
        self._meta = meta
        self._refused_value = tf.compat.v1.placeholder(tf.int64, [], "antdt_refused_value")
        self._refuse = self.feed.refused_lease.assign(self._refused_value)

    def before_run(self, run_context):
        self._t0 = time.perf_counter()
        return tf.compat.v1.train.SessionRunArgs(self._meta)

    def after_run(self, run_context, run_values):
        self.step_seconds += time.perf_counter() - self._t0
        lease, shard, epoch, applied, records, incarnation = (int(v) for v in run_values.results)
        client = self.feed.client
        client.incarnation = incarnation       # the pipeline's antdt.open answer
        rejected = client.report([lease], [shard], [epoch], [applied])
        self.steps += 1
        if rejected:
            self.refused += 1
            run_context.session.run(self._refuse, {self._refused_value: lease})
            log.info("worker %d: lease %d is no longer ours (stolen, expired or restored); "
                     "skipping its other batches", self.feed.worker, lease)
        else:
            self.records += records


class ShardingStateSaver(tf.compat.v1.train.CheckpointSaverListener):
    """Puts the master's sharding state (``SaveState``) into every checkpoint the chief
    writes, and gives it back to the master (``RestoreState``) when the chief's session
    came from a checkpoint: model and data position restore together.

    The state lives in a ``tf.string`` variable on the chief's own task, saved by the
    same ``Saver`` as the model. Training is asynchronous: the snapshot is taken just
    before the save and PS variables are read while other workers keep updating them,
    so records trained in between are in the model but not in the snapshot — after a
    restore they are trained again (at-least-once within the save's duration)."""

    def __init__(self, feed: ShardFeed):
        self.feed = feed
        self.saves = 0
        self.checked = False       # looked for a restored state in this process
        self.restored = False
        self._admin = None

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        existing = graph.get_collection("antdt_sharding_state")
        if existing:
            self._var, self._value, self._assign = existing
            return
        with tf.compat.v1.variable_scope("antdt", reuse=tf.compat.v1.AUTO_REUSE):
            self._var = tf.compat.v1.get_variable("sharding_state", shape=[], dtype=tf.string,
                                                  initializer=tf.compat.v1.constant_initializer(""),
                                                  trainable=False, use_resource=True)
        self._value = tf.compat.v1.placeholder(tf.string, [], name="antdt_sharding_state_value")
        self._assign = self._var.assign(self._value)
        for t in (self._var, self._value, self._assign):
            graph.add_to_collection("antdt_sharding_state", t)

    def _client(self) -> ShardingClient:
        if self._admin is None:
            self._admin = ShardingClient(self.feed.master)
        return self._admin

    def maybe_restore(self, session) -> None:
        """Once per process, before this process writes the variable: if the session
        came from a checkpoint, the variable holds that checkpoint's sharding state —
        hand it to the master. Runs from whichever comes first: the restore hook's
        ``after_create_session`` or the first save (``CheckpointSaverHook`` saves right
        after the session is created, and Estimator runs it before user hooks)."""
        if self.checked:
            return
        self.checked = True
        state = session.run(self._var)
        if state:
            resp = self._client().restore_state(state)
            self.restored = True
            log.info("restored the checkpoint's sharding state on the master (%d shard(s) "
                     "back to TODO)", resp.requeued_shards)

    def before_save(self, session, global_step_value):
        self.maybe_restore(session)
        state = self._client().save_state([self.feed.dataset])
        session.run(self._assign, {self._value: state})
        self.saves += 1

    def end(self, session, global_step_value):
        if self._admin is not None:
            self._admin.close()
            self._admin = None


class RestoreShardingStateHook(tf.compat.v1.train.SessionRunHook):
    """Chief only: after the session is created (and restored from the latest
    checkpoint, if there is one), hands that checkpoint's sharding state to the master."""

    def __init__(self, saver: ShardingStateSaver):
        self.saver = saver

    def begin(self):
        self.saver.begin()     # the variable must exist before the graph is finalized

    def after_create_session(self, session, coord):
        self.saver.maybe_restore(session)
