"""Controller: turns the Monitor's judgement into actions (pure Python, no TensorFlow).

A :class:`~antdt_tf.controller.policy.Policy` looks at an :class:`Observation` (every
worker's and PS's straggler class and speed, the work left, what actions cost here) and
returns actions; the master's job runner carries them out through the cluster backend
(``antdt_tf.master.runner``). See
``antdt_tf.controller.policy`` for the preset policies and how to write one.
"""

from antdt_tf.controller.actions import (Action, AdjustBatchSizes, RelaunchWorker, ReplacePs,
                                         ScaleWorkers)
from antdt_tf.controller.policy import (AntDTDD, AntDTND, BackupWorkers, CostModel,
                                        DynamicOnly, Observation, Policy, PolicyTraits,
                                        StaticSharding, TaskView, balanced_batch_sizes,
                                        load_policy)

__all__ = ["Action", "AdjustBatchSizes", "AntDTDD", "AntDTND", "BackupWorkers", "CostModel",
           "DynamicOnly", "Observation", "PolicyTraits", "Policy", "RelaunchWorker", "ReplacePs", "ScaleWorkers",
           "StaticSharding", "TaskView", "balanced_batch_sizes", "load_policy"]
