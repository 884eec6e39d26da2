"""Which hooks a TF1 worker's job gets, in which order, wired to what: the one place that
builds them. :class:`~antdt_tf.estimator.feed.ShardFeed`'s ``hooks()``,
``saving_listeners()`` and ``chief_hooks()`` call these with their own state, so the
hooks get everything as arguments and never look into the feed.

Imports TensorFlow (through the hooks): the feed imports this module only when it is
asked for hooks, never at module level.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from antdt_tf.estimator.hooks import (LeaseSettleHook, MasterAdmin, RestoreShardingStateHook,
                                      ShardingStateSaver, ShardReportHook,
                                      TimedCheckpointSaverHook)
from antdt_tf.sharding.tf_rpc_client import TfRpcClient


def chief_saver(master: str, dataset: str) -> ShardingStateSaver:
    """The chief's ``ShardingStateSaver`` (one per feed), owning the chief's client of the
    master that its ``LeaseSettleHook`` shares."""
    return ShardingStateSaver(dataset, MasterAdmin(master))


def session_hooks(client: TfRpcClient, worker: int, dataset: str, sparse_reports: bool,
                  saver: Optional[ShardingStateSaver] = None) -> list:
    """Every worker's ``SessionRunHook``s, in order (``saver``: the chief's, ``None`` on
    other workers):

    1. ``ShardReportHook`` — first, and on every worker (callers read its counts as
       ``hooks[0]``);
    2. chief: ``RestoreShardingStateHook`` — its ``after_create_session`` hands a
       restored checkpoint's sharding state to the master before the settle hook's
       thread starts polling in its own;
    3. chief with sparse reports: a new ``LeaseSettleHook``, which the saver then settles
       through before each save (the latest one: a second call replaces it)."""
    hooks = [ShardReportHook(client, worker, sparse_reports)]
    if saver is not None:
        hooks.append(RestoreShardingStateHook(saver))
        if sparse_reports:
            saver.settle_hook = LeaseSettleHook(dataset, saver.master_admin)
            hooks.append(saver.settle_hook)
    return hooks


def saving_listeners(saver: Optional[ShardingStateSaver]) -> list:
    """``Estimator.train(saving_listeners=...)``: the chief's saver; none elsewhere."""
    return [saver] if saver is not None else []


def checkpoint_hooks(checkpoint_dir: str, saver: ShardingStateSaver,
                     save_secs: Optional[float] = None,
                     save_steps: Optional[int] = None) -> list:
    """``MonitoredTrainingSession(chief_only_hooks=...)``: one checkpoint saver hook whose
    checkpoints carry the sharding state — ``TimedCheckpointSaverHook`` with only
    ``save_secs`` (no ``global_step`` fetch per step), TF's ``CheckpointSaverHook``
    otherwise."""
    listeners = [saver]
    if save_secs is not None and save_steps is None:
        return [TimedCheckpointSaverHook(checkpoint_dir, save_secs, listeners=listeners)]
    return [tf.compat.v1.train.CheckpointSaverHook(
        checkpoint_dir, save_secs=save_secs, save_steps=save_steps, listeners=listeners)]
