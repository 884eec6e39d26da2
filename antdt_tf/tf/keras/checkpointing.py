"""Checkpoints of the Keras path: model, optimizer (slots), sharding state and the audit
counters in one ``tf.train.Checkpoint``, so that a restore rolls the model and the
master back to the same step boundary. Draining the scheduled steps before a save is
the callback's (:meth:`ShardingCallback.save`): only it knows the coordinator.
"""

from __future__ import annotations

import logging
import time

import tensorflow as tf

log = logging.getLogger(__name__)


class Checkpoints:
    """A ``tf.train.CheckpointManager`` (3 kept) over ``model`` (and its optimizer),
    the master's state of ``dataset`` and, in audit mode, ``applied`` / ``started``."""

    def __init__(self, model, client, dataset: str, directory: str,
                 every_seconds: float, applied=None, started=None):
        from antdt_tf.tf.checkpoint import ShardingStateSlot

        objects = {"model": model, "sharding": ShardingStateSlot(client, [dataset])}
        if getattr(model, "optimizer", None) is not None:
            objects["optimizer"] = model.optimizer
        if applied is not None:
            objects["audit"] = tf.train.Checkpoint(applied=applied, started=started)
        self.manager = tf.train.CheckpointManager(tf.train.Checkpoint(**objects),
                                                  directory, max_to_keep=3)
        self.every_seconds = every_seconds
        self._last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.every_seconds

    def restore_or_initialize(self) -> str:
        """Restores the latest checkpoint; without one, writes an initial checkpoint (so
        a restart before the first boundary rolls the master back too). Returns the
        restored path or ''."""
        latest = self.manager.latest_checkpoint
        if latest:
            self.manager.checkpoint.restore(latest)
            log.info("restored %s", latest)
            return latest
        self.manager.save()
        return ""

    def save(self) -> str:
        """Writes a checkpoint (call it with every scheduled step finished)."""
        path = self.manager.save()
        log.info("checkpoint %s written", path)
        self._last = time.monotonic()
        return path
