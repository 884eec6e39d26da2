"""The master: one per job, it outlives every other process of it.

- :mod:`~antdt_tf.master.server`: ``MasterServer`` composes the sharding service
  (``antdt.v1.ShardingService``), the cluster monitor (``antdt.v1.ClusterMonitor``: agent
  and trainer reports, the Monitor's judgement, the job's cluster), the workers' TF-RPC
  data path and the health service on one gRPC server; ``BackgroundMaster`` runs one in
  this process (tests, demos).
- ``python -m antdt_tf.master`` / ``antdt-master`` (:mod:`antdt_tf.master.__main__`): the
  binary, with persistence (``--state_dir``) and the job token.
"""


def run():
    """The ``antdt-master`` console script (same as ``python -m antdt_tf.master``)."""
    from antdt_tf.master.__main__ import run as run_master

    run_master()
