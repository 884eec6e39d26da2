"""Agent: one per host; owns the job's TF task processes (start, stop, kill, relaunch),
reports their liveness to the master, and injects faults and stragglers on request.

- :class:`~antdt_tf.agent.supervisor.TaskSupervisor`: the processes, no gRPC.
- ``antdt-agent`` (:mod:`antdt_tf.agent.agent`): the daemon serving ``antdt.v1.Agent``.
- :class:`~antdt_tf.agent.client.AgentClient`: the master's side (its job runner).
- :class:`~antdt_tf.agent.throttle.CpuThrottle`: a real slowdown of a process.
"""
