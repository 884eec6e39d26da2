"""TensorFlow integration: the only package (with ``antdt_tf.models``) that imports TF.

- ``reader``: reads a shard (a record range of a compact record file) on the worker with
  TF ops only; no Python on the data path.
- ``trainer``: ``ShardTrainer``, a custom loop over ``ClusterCoordinator`` fed by the
  master; re-run closures resume after their applied batches.
- ``checkpoint``: model + sharding state in one ``tf.train.Checkpoint``.
- ``server`` / ``coordinator``: the TF task and chief binaries; ``local_cluster`` runs
  them on this machine.

Failure modes handled: worker death (closure re-run, resumed), coordinator death and PS
death (the coordinator exits 75; its relaunch restores model and sharding state
together), master restart (clients wait and retry). Relaunching is the supervisor's
job (the coming launcher/agents; tests do it by hand).
"""
