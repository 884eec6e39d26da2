"""Controller: turns the Monitor's judgement into actions (pure Python, no TensorFlow).

A :class:`~antdt_tf.controller.policy.Policy` looks at an :class:`Observation` (every
worker's and PS's straggler class and speed, the work left, what actions cost here) and
returns actions; the launcher carries them out through the agents. See
``antdt_tf.controller.policy`` for the preset policies and how to write one.
"""

from antdt_tf.controller.actions import Action, RelaunchWorker, ReplacePs, ScaleWorkers
from antdt_tf.controller.policy import (AntDTDD, AntDTND, CostModel, DynamicOnly,
                                        Observation, Policy, StaticSharding, TaskView,
                                        load_policy)

__all__ = ["Action", "AntDTDD", "AntDTND", "CostModel", "DynamicOnly", "Observation",
           "Policy", "RelaunchWorker", "ReplacePs", "ScaleWorkers", "StaticSharding",
           "TaskView", "load_policy"]
