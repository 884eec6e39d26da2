"""``ShardingCallback``: the one object a ``model.fit`` chief adds. It wires the parts of
this package together — :mod:`.step` (the wrapped ``train_step``, installed by
``attach``), :mod:`.pacing` (the scheduled steps and the settles), :mod:`.checkpointing`
— and stops ``fit`` when the master says every epoch is done.
"""

from __future__ import annotations

import logging

import tf_keras as keras   # the [tf] extra installs it; TF_USE_LEGACY_KERAS=1 makes it tf.keras

from antdt_tf.sharding.client import ShardingClient
from antdt_tf.tf import tf_internals
from antdt_tf.tf.keras.checkpointing import Checkpoints
from antdt_tf.tf.keras.pacing import LeaseSettler, StepPacer
from antdt_tf.tf.keras.step import (ReportingStep, audit_variables, lease_record_variable,
                                    spare_row, worker_state_variable)
from antdt_tf.tf.master_rpc import DEFAULT_TIMEOUT_MS
from antdt_tf.tf.tf_internals import accept_remote_logs

log = logging.getLogger(__name__)


class ShardingCallback(keras.callbacks.Callback):
    """Reports applied records (after every step, or per lease with sparse reports),
    stops ``fit`` when the master is done, and checkpoints model + optimizer + sharding
    state at step boundaries.

    Args:
      master / dataset: the job's master and the registered dataset.
      checkpoint_dir: where ``tf.train.CheckpointManager`` keeps checkpoints ('' = none).
      checkpoint_every_seconds: checkpoint this often (after draining the scheduled steps).
      check_every_batches: ask the master whether the dataset is finished this often.
      max_ahead: steps scheduled ahead of the executed ones (bounds the padding steps
        that still run after the data ended); with ``steps_per_execution`` > 1 at least
        two executions per worker stay scheduled, so that no worker waits for the chief.
      audit_records: if > 0, count per record id how often it was applied (a variable on
        the PS, updated in the step) — ``applied_counts()`` returns the counts.
      sparse_reports: steps record their lease position on the PS and report a lease
        when it is finished; this callback settles dead workers' leases from the record
        (pass the same to :func:`dataset_creator`).
      worker_slots: rows of the lease record (the largest worker index + 1 the job may
        scale to); 0 = the workers of the strategy's cluster.
      settle_seconds: with sparse reports, how often the chief asks the master for held
        leases (well under the master's ``--settle_seconds``).
    """

    def __init__(self, master: str, dataset: str, checkpoint_dir: str = "",
                 checkpoint_every_seconds: float = 30.0, check_every_batches: int = 16,
                 audit_records: int = 0, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 max_ahead: int = 16, sparse_reports: bool = False, worker_slots: int = 0,
                 settle_seconds: float = 1.0):
        super().__init__()
        accept_remote_logs(self)         # batch hooks under PSS (they see RemoteValues)
        self.master, self.dataset = master, dataset
        self.client = ShardingClient(master)
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every_seconds = checkpoint_every_seconds
        self.check_every_batches = check_every_batches
        self.audit_records = audit_records
        self.timeout_ms = timeout_ms
        self.sparse_reports = sparse_reports
        self.worker_slots = worker_slots
        self.settle_seconds = settle_seconds
        self.applied = self.started = None   # audit counters (attach makes them)
        self.worker_state = None  # per worker: refused lease, (micros, steps) unreported
        self.pacer = StepPacer(max_ahead)
        self.settler = LeaseSettler(self.client, master, dataset, settle_seconds)
        self.checkpoints = None   # Checkpoints, made by attach when checkpoint_dir is set
        self.restored_from = ""
        self._num_workers = 1
        self._wrapped = None

    max_ahead = property(lambda self: self.pacer.max_ahead,
                         lambda self, n: setattr(self.pacer, "max_ahead", n))
    lease_record = property(lambda self: self.settler.lease_record,
                            doc="sparse reports: the PS lease record (attach makes it)")
    settled = property(lambda self: self.settler.settled,
                       doc="held leases settled from the lease record")
    manager = property(lambda self: self.checkpoints and self.checkpoints.manager,
                       doc="the tf.train.CheckpointManager, or None")

    # -------------------------------------------------------------- set-up

    def steps_upper_bound(self, batch_size: int) -> int:
        """A ``steps_per_epoch`` that can never cut the data short (the callback
        stops ``fit`` when the master says the data is done)."""
        p = self.client.progress(self.dataset).datasets[0]
        return 2 * (-(-p.records_per_epoch * p.num_epochs // batch_size)) + 1000

    def attach(self, model):
        """Wraps ``model.train_step`` — the model's own, a custom one included — in the
        step that keeps the master's ledger exact (:class:`~antdt_tf.tf.keras.step.
        ReportingStep`, which says what it does on every batch), and returns the model.
        Call it once, after ``compile`` and before :meth:`restore_or_initialize` and ``fit``.

        What a custom ``train_step`` must respect: take ``sample_weight`` from
        ``keras.utils.unpack_x_y_sample_weight(data)`` and weight the loss with it (a
        step of weight 0 must not move the model: true for SGD and Adagrad; momentum
        and Adam still move a little); make every update of the step inside it (the
        report waits for the step's stateful ops, not for work done elsewhere); and
        keep ``steps_per_execution`` equal to :func:`dataset_creator`'s."""
        if self._wrapped is model:
            return model
        strategy = model.distribute_strategy
        if self.audit_records and self.applied is None:
            self.applied, self.started = audit_variables(strategy, self.audit_records)
        resolver = tf_internals.cluster_resolver(strategy)
        workers = len(resolver.cluster_spec().as_dict().get("worker", [])) if resolver else 0
        slots = max(self.worker_slots, workers)
        if slots <= 0:
            raise ValueError("pass worker_slots > 0 (the job's largest worker index + 1): "
                             "the strategy does not say")
        self._num_workers = workers or slots
        if self.worker_state is None:
            self.worker_state = worker_state_variable(strategy, slots)
        if self.sparse_reports and self.lease_record is None:
            self.settler.lease_record = lease_record_variable(strategy, slots)
        model.train_step = ReportingStep(
            model.train_step, self.master, self.dataset, self.timeout_ms, self.worker_state,
            lease_record=self.lease_record, record_spare_row=spare_row(slots),
            applied=self.applied, started=self.started, sparse=self.sparse_reports)
        model.train_function = None      # rebuilt by fit() with the wrapped step
        self._wrapped = model
        if self.checkpoint_dir and self.checkpoints is None:
            self.checkpoints = Checkpoints(model, self.client, self.dataset,
                                           self.checkpoint_dir, self.checkpoint_every_seconds,
                                           applied=self.applied, started=self.started)
        return model

    def restore_or_initialize(self, model) -> str:
        """Restores model, optimizer (slots) and sharding state from the latest
        checkpoint; without one, writes an initial checkpoint (so a restart before the
        first boundary rolls the master back too). Returns the restored path or ''."""
        self._check_attached(model)
        if self.checkpoints is None:
            return ""
        latest = self.checkpoints.restore_or_initialize()
        if latest:
            self.restored_from = latest
        return latest

    def _check_attached(self, model) -> None:
        if self._wrapped is not model:
            raise ValueError(
                "ShardingCallback: this model's train_step is not wrapped; call "
                "`model = sharding.attach(model)` after compile and before "
                "restore_or_initialize and fit (the wrapped step is what reports the "
                "trained records to the master)")

    def set_model(self, model):
        super().set_model(model)
        self._check_attached(model)

    # -------------------------------------------------------------- hooks

    def settle(self, drained: bool = False) -> int:
        """Asks the master how the data goes and (sparse reports) settles the leases it
        holds for dead or silent workers (:meth:`LeaseSettler.settle`). Returns how many
        leases were held; sets ``stop_training`` when the master is done."""
        held, finished = self.settler.settle(drained)
        if finished and self.model is not None:
            self.model.stop_training = True
        return held

    def _settle_if_due(self) -> None:
        if self.lease_record is not None and self.settler.due():
            self.settle()

    def _join(self) -> None:
        coordinator = tf_internals.keras_coordinator(self.model)
        if coordinator is not None:
            coordinator.join()

    def save(self) -> str:
        """Drains the scheduled steps (so every pulled batch is trained and
        reported), then writes model + optimizer + sharding state."""
        self._join()
        if self.lease_record is not None:   # the snapshot agrees with the model
            self.settle(drained=True)
        return self.checkpoints.save()

    def on_train_begin(self, logs=None):
        self.pacer.start(tf_internals.steps_per_execution(self.model), self._num_workers)
        self.settler.start_keeping()

    def on_train_batch_end(self, batch, logs=None):
        # Under PSS this runs when the step is *scheduled*, with its logs a RemoteValue.
        if logs is not None and hasattr(logs, "fetch"):
            self.pacer.add(logs, while_waiting=self._settle_if_due)
        if self.checkpoints is not None and self.checkpoints.due():
            self.save()
            self.pacer.clear()
        if (batch + 1) % self.check_every_batches == 0 or self.settler.due():
            self.settle()

    def on_train_end(self, logs=None):
        self._join()
        if self.lease_record is not None:
            self.settle()
        self.settler.stop_keeping()
        if not self.client.progress(self.dataset).datasets[0].finished:
            log.warning("fit ended before the master finished the dataset: raise "
                        "steps_per_epoch (see steps_upper_bound)")

    def applied_counts(self):
        """Audit mode, per record: how many steps that trained it had *every* update
        land (the step's variable writes are separate RPCs to the PS; this count is
        written after all of them). See :meth:`started_counts`."""
        from antdt_tf.tf.variables import full_value

        return full_value(self.applied).numpy()

    def started_counts(self):
        """Audit mode, per record: how many steps that trained it began (written before
        any of the step's updates). ``started - applied`` > 0 marks a record whose step
        a kill cut: anywhere from none to all of that step's updates landed,
        and the batch was trained again (the lease record says where the lease was
        before it). At most one batch per killed worker."""
        from antdt_tf.tf.variables import full_value

        return full_value(self.started).numpy()
