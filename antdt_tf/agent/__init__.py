"""Agent: one per host; owns the TF task processes (start, stop, kill, relaunch) and
injects faults and stragglers for tests and benchmarks.

So far: :class:`~antdt_tf.agent.throttle.CpuThrottle`, a real slowdown of a process.
The agent daemon and its RPCs come with the launcher.
"""
