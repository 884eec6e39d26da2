"""SessionRunHooks that connect a TF1 worker (``MonitoredTrainingSession`` or
``tf.estimator``) to the master: report what each step trained, and keep the sharding
state inside the chief's checkpoints.

Each hook gets its Python collaborators as constructor arguments (the worker's
``TfRpcClient``, the chief's :class:`MasterAdmin`, ...) and finds the graph the feed
built through the collections of :mod:`~antdt_tf.estimator.graph_keys`; none imports the
feed. Which hooks a job gets, in which order: :mod:`~antdt_tf.estimator.assembly`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Optional

import tensorflow as tf

from antdt_tf.estimator.graph_keys import (META_COLLECTION, META_FIELDS, RECORD_COLLECTION,
                                           REFUSED_LEASE_COLLECTION,
                                           SHARDING_STATE_COLLECTION, SHARDING_STATE_VARIABLE,
                                           VARIABLE_SCOPE)
from antdt_tf.sharding.client import ShardingClient
from antdt_tf.sharding.tf_rpc_client import TfRpcClient, report_due

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Unreported:
    """The worker's own work since its last report: the Monitor's BPT comes with it."""
    seconds: float = 0.0
    steps: int = 0
    records: int = 0


class ShardReportHook(tf.compat.v1.train.SessionRunHook):
    """After every step: tells the master how far the trained batch's lease got — with
    sparse reports (``ShardFeed(sparse_reports=True)``, the default) only when the lease
    is finished or the master marked it per batch (``meta sparse == 0``: leases it may
    steal or back up), otherwise once per lease; the step itself records its position
    on the PS (the feed's ``antdt_lease_record`` update, fetched with the step).

    ``after_run`` runs once the step's updates were applied on the PS (the session run
    returned), so a worker killed at any moment loses at most the batch it was training
    and has reported nothing it did not apply — the same bound as the TF2 path. A
    refused report (the lease was stolen or expired) makes the feed skip the rest of
    that lease. Reports carry the worker's own time in session.run since the previous
    one (the Monitor's BPT); the hook also keeps its step times (``step_seconds``).

    ``client``: the worker's client of the master (the feed's: the pipeline's
    incarnation is written back to it); ``worker``: its index (for the log);
    ``sparse_reports``: as the feed's."""

    def __init__(self, client: TfRpcClient, worker: int, sparse_reports: bool = True):
        self.client = client
        self.worker = worker
        self.sparse_reports = sparse_reports
        self.steps = 0
        self.records = 0
        self.refused = 0
        self.reports = 0
        self.step_seconds = 0.0     # wall time inside session.run, summed
        self.first_step_unix = None  # when the first step started, the last one ended
        self.last_step_unix = None
        self._fetches = None
        self._t0 = 0.0
        self._pending = None        # (lease, shard, epoch, applied) not yet reported
        self._since = _Unreported()

    def begin(self):
        meta = tf.compat.v1.get_collection(META_COLLECTION)
        refused = tf.compat.v1.get_collection(REFUSED_LEASE_COLLECTION)
        if len(meta) != 1 or len(refused) != 1:
            raise ValueError("ShardReportHook needs the graph built by ShardFeed.input_fn "
                             f"(found {len(meta)} lease tensors in {META_COLLECTION!r})")
        record = tf.compat.v1.get_collection(RECORD_COLLECTION)
        # with sparse reports the record update runs in the step's own session.run
        self._fetches = (meta[0], record[1]) if record else (meta[0], tf.no_op())
        self._refused_value = tf.compat.v1.placeholder(tf.int64, [], "antdt_refused_value")
        self._refuse = refused[0].assign(self._refused_value)

    def before_run(self, run_context):
        if self.first_step_unix is None:
            self.first_step_unix = time.time()
        self._t0 = time.perf_counter()
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        seconds = time.perf_counter() - self._t0
        self.last_step_unix = time.time()
        self.step_seconds += seconds
        values = dict(zip(META_FIELDS, run_values.results[0].tolist()))
        self.client.incarnation = values["incarnation"]   # the pipeline's antdt.open
        if self._pending is not None and self._pending[0] != values["lease"]:
            self._report(run_context.session)   # (a lease always ends on a due batch)
        self.steps += 1
        self._since.seconds += seconds
        self._since.steps += 1
        self._since.records += values["records"]
        self._pending = (values["lease"], values["shard"], values["epoch"], values["applied"])
        if report_due(self.sparse_reports, values["sparse"], values["applied"],
                      values["length"]):
            self._report(run_context.session)

    def _report(self, session) -> None:
        lease, shard, epoch, applied = self._pending
        since = self._since
        rejected = self.client.report([lease], [shard], [epoch], [applied],
                                      seconds=since.seconds, steps=since.steps)
        self.reports += 1
        self._pending, self._since = None, _Unreported()
        if rejected:
            self.refused += 1
            session.run(self._refuse, {self._refused_value: lease})
            log.info("worker %d: lease %d is no longer ours (stolen, expired or restored); "
                     "skipping its other batches", self.worker, lease)
        else:
            self.records += since.records

    def end(self, session):
        if self._pending is not None:   # the last batch of a lease not finished here
            self._report(session)


class MasterAdmin:
    """The chief's one ``ShardingClient`` of the master, opened on first use and shared by
    its :class:`ShardingStateSaver` and :class:`LeaseSettleHook` (whose thread uses it
    too, hence the lock). Whichever ends first closes it; the next use reopens it."""

    def __init__(self, master: str):
        self.master = master
        self._client = None
        self._lock = threading.Lock()

    def client(self) -> ShardingClient:
        with self._lock:
            if self._client is None:
                self._client = ShardingClient(self.master)
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class LeaseSettleHook(tf.compat.v1.train.SessionRunHook):
    """Chief only, with sparse reports: the master holds the sparse leases of a worker
    that died, was replaced or went silent (``DatasetProgress.held``) instead of
    re-issuing them from its older count; this hook reads the lease record on the PS
    and settles them (``ApplyLeaseRecord``).

    It looks from a thread of its own, about every ``poll_seconds`` while the chief's
    session lives, not from ``after_run``: when a held lease is all the work left, the
    chief's own step blocks in its input pipeline waiting for a lease, and only the
    settle can give it one (``tf.Session.run`` is thread-safe). If the chief itself
    stays away longer than the master's ``--settle_seconds``, the master settles at
    its own count: up to one lease of that worker is trained again.

    ``dataset``: the feed's dataset; ``master_admin``: the chief's client of the master,
    shared with its :class:`ShardingStateSaver`."""

    def __init__(self, dataset: str, master_admin: MasterAdmin, poll_seconds: float = 1.0):
        self.dataset = dataset
        self.master_admin = master_admin
        self.poll_seconds = poll_seconds
        self.settled = 0
        self._session = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def begin(self):
        record = tf.compat.v1.get_collection(RECORD_COLLECTION)
        if not record:
            raise ValueError("LeaseSettleHook needs ShardFeed(sparse_reports=True).input_fn's "
                             f"graph (no {RECORD_COLLECTION!r} collection)")
        self._record = record[0]

    def after_create_session(self, session, coord):
        self._session = session      # (again after MonitoredSession recreated it)
        if self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="antdt-lease-settle",
                                            daemon=True)
            self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.settle(self._session)
            except Exception as e:   # a session being recreated, the master restarting
                log.warning("settling held leases failed (next try in %.1f s): %s",
                            self.poll_seconds, e)

    def settle(self, session, everything: bool = False) -> int:
        """Settles the held leases from the record (``everything``: also brings the
        master's count of live leases up to it, before a checkpoint). Returns how many
        leases were held."""
        from antdt_tf.tf.accounting import apply_lease_records

        admin = self.master_admin.client()   # the chief's one client
        with self._lock:
            progress = admin.progress(self.dataset).datasets
            held = list(progress[0].held) if progress else []
            if held or everything:
                apply_lease_records(admin.apply_lease_record, self.dataset,
                                    session.run(self._record), held)
                self.settled += len(held)
            return len(held)

    def end(self, session):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.master_admin.close()


class TimedCheckpointSaverHook(tf.compat.v1.train.CheckpointSaverHook):
    """``CheckpointSaverHook(save_secs=...)`` that reads ``global_step`` only when a save
    may be due. TF's hook fetches it from the PS with every step although with
    ``save_secs`` only the clock decides: one more tensor from the PS a step, +0.7 ms
    of CPU per step on the chief in ``benchmarks/tf1_step_cost.py`` (≈ 9 %). Everything
    else — what is written, the listeners, the save at the start and the end — is TF's
    hook's: it gets the step it would have fetched, at most every ``poll_seconds``
    (default ``min(1 s, save_secs / 4)``), so a save is at most that late."""

    def __init__(self, checkpoint_dir: str, save_secs: float, poll_seconds=None, **kwargs):
        super().__init__(checkpoint_dir, save_secs=save_secs, **kwargs)
        self.poll_seconds = min(1.0, save_secs / 4) if poll_seconds is None else poll_seconds
        self._next_poll = 0.0
        self._step = None

    def begin(self):
        super().begin()
        self._step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session, coord):
        super().after_create_session(session, coord)
        self._next_poll = time.monotonic() + self.poll_seconds

    def before_run(self, run_context):
        return None     # nothing fetched with the step

    def after_run(self, run_context, run_values):
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + self.poll_seconds
        step = run_context.session.run(self._step)
        super().after_run(run_context, tf.compat.v1.train.SessionRunValues(
            results=step, options=None, run_metadata=None))


class ShardingStateSaver(tf.compat.v1.train.CheckpointSaverListener):
    """Puts the master's sharding state (``SaveState``) into every checkpoint the chief
    writes, and gives it back to the master (``RestoreState``) when the chief's session
    came from a checkpoint: model and data position restore together.

    The state lives in a ``tf.string`` variable on the chief's own task, saved by the
    same ``Saver`` as the model. Training is asynchronous: the snapshot is taken just
    before the save and PS variables are read while other workers keep updating them,
    so records trained in between are in the model but not in the snapshot — after a
    restore they are trained again (at-least-once within the save's duration).

    ``settle_hook``: the chief's current :class:`LeaseSettleHook` (sparse reports), set
    by :func:`~antdt_tf.estimator.assembly.session_hooks`; it settles before each save."""

    def __init__(self, dataset: str, master_admin: MasterAdmin):
        self.dataset = dataset
        self.master_admin = master_admin
        self.settle_hook: Optional[LeaseSettleHook] = None
        self.saves = 0
        self.checked = False       # looked for a restored state in this process
        self.restored = False

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        existing = graph.get_collection(SHARDING_STATE_COLLECTION)
        if existing:
            self._var, self._value, self._assign = existing
            return
        with tf.compat.v1.variable_scope(VARIABLE_SCOPE, reuse=tf.compat.v1.AUTO_REUSE):
            self._var = tf.compat.v1.get_variable(
                SHARDING_STATE_VARIABLE, shape=[], dtype=tf.string,
                initializer=tf.compat.v1.constant_initializer(""), trainable=False,
                use_resource=True)
        self._value = tf.compat.v1.placeholder(tf.string, [], name="antdt_sharding_state_value")
        self._assign = self._var.assign(self._value)
        for t in (self._var, self._value, self._assign):
            graph.add_to_collection(SHARDING_STATE_COLLECTION, t)

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
            resp = self.master_admin.client().restore_state(state)
            self.restored = True
            log.info("restored the checkpoint's sharding state on the master (%d shard(s) "
                     "back to TODO)", resp.requeued_shards)

    def before_save(self, session, global_step_value):
        self.maybe_restore(session)
        if self.settle_hook is not None:
            # sparse reports: the master's counts up to the PS record first, so the
            # snapshot is at most the batch in flight behind the model
            self.settle_hook.settle(session, everything=True)
        state = self.master_admin.client().save_state([self.dataset])
        session.run(self._assign, {self._value: state})
        self.saves += 1

    def end(self, session, global_step_value):
        self.master_admin.close()


class RestoreShardingStateHook(tf.compat.v1.train.SessionRunHook):
    """Chief only: after the session is created (and restored from the latest
    checkpoint, if there is one), hands that checkpoint's sharding state to the master."""

    def __init__(self, saver: ShardingStateSaver):
        self.saver = saver

    def begin(self):
        self.saver.begin()     # the variable must exist before the graph is finalized

    def after_create_session(self, session, coord):
        self.saver.maybe_restore(session)
