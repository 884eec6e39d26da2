"""Cluster backends: where a job's tasks run.

- :mod:`~antdt_tf.backends.base`: the ``ClusterBackend`` interface and its vocabulary
  (``TaskName`` with a generation, ``Placement``, ``TaskState``, ``Failure``), pure Python.
- :mod:`~antdt_tf.backends.agents`: ``AgentsBackend``, one ``antdt-agent`` per real host,
  found through the master (rendezvous) or a fixed list.
- :mod:`~antdt_tf.backends.local`: ``LocalBackend``, simulated hosts on loopback (the
  embedded default), with stable endpoints.
- :mod:`~antdt_tf.backends.ray`: ``RayBackend``, every task a detached actor pinned to a
  node of a Ray cluster (imports Ray: the ``[ray]`` extra; its settings in
  :mod:`~antdt_tf.backends.ray_settings`).

Guarantees every backend gives (the conformance suite, ``tests/test_backend_conformance.py``,
checks them): a launch is idempotent per name and generation; an older generation is
refused; task ends map to one failure vocabulary (exited with a code, killed, out of
memory, host lost, unschedulable); a new backend object over the same hosts sees what
runs and launches nothing twice.
"""

from antdt_tf.backends.base import (Capabilities, ClusterBackend, Failure, FailureKind, Host,
                                    Placement, TaskInfo, TaskName, TaskSpec, TaskState)

__all__ = ["Capabilities", "ClusterBackend", "Failure", "FailureKind", "Host", "Placement",
           "TaskInfo", "TaskName", "TaskSpec", "TaskState"]
