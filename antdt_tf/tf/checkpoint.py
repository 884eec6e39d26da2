"""Checkpoints that hold the model *and* the sharding state, so they always agree.

The sharding state (the master's ``SaveState`` bytes) rides inside the
``tf.train.Checkpoint`` as a ``tf.train.experimental.PythonState``: it is fetched from
the master when the checkpoint is written (at a shard boundary, with no closure in
flight) and handed back to the master (``RestoreState``) when the checkpoint is
restored — every shard that was DOING then is TODO again, exactly like the model.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from antdt_tf.sharding.client import ShardingClient

log = logging.getLogger(__name__)


class ShardingStateSlot(tf.train.experimental.PythonState):
    """The master's sharding state as a value of a ``tf.train.Checkpoint``: asked from the
    master when the checkpoint is written, handed back to it when one is restored, so
    model and data position restore together."""

    def __init__(self, client: ShardingClient, datasets):
        self.client = client
        self.datasets = list(datasets)

    def serialize(self):
        return self.client.save_state(self.datasets)

    def deserialize(self, string_value):
        resp = self.client.restore_state(bytes(string_value))
        log.info("sharding state restored for %s (%d leased shard(s) back to TODO)",
                 list(resp.datasets), resp.requeued_shards)


class ShardingCheckpoint:
    """``tf.train.CheckpointManager`` over ``{model, sharding state}``."""

    def __init__(self, directory: str, model: tf.Module, client: ShardingClient, datasets,
                 max_to_keep: int = 3, **extra):
        """``extra``: more trackables saved and restored with the model (e.g. an optimizer
        or the trainer's per-worker counters)."""
        self.checkpoint = tf.train.Checkpoint(model=model,
                                              sharding=ShardingStateSlot(client, datasets),
                                              **extra)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep)

    def restore_or_initialize(self) -> str | None:
        """Restores the latest checkpoint (model and sharding state); without one, writes
        an initial checkpoint so that a restart before the first boundary also rolls the
        master back to the same point as the (fresh) model. Returns the restored path."""
        latest = self.manager.latest_checkpoint
        if latest:
            self.checkpoint.restore(latest).assert_existing_objects_matched()
            log.info("restored %s", latest)
            return latest
        self.save()
        return None

    def save(self) -> str:
        path = self.manager.save()
        log.info("checkpoint %s written", path)
        return path
