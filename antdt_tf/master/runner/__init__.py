"""The job runner: one job's tasks started, supervised and acted on through a cluster
backend, inside the master (``antdt_tf.master.job_control``).

- ``runner``: the loop (observe -> decide -> act) and the job's record;
- ``tasks``: hosts, addresses and launches (``taskspecs``: each task's typed arguments);
- ``executor``: the Controller's actions carried out (each an ``ActionRun``), injections;
- ``recovery``: tasks that died, hosts lost, leases released;
- ``resume``: a restarted master carrying on the job it ran;
- ``report``: the job's report, a function of its record; ``faults``: recovery times.
"""

from antdt_tf.master.runner.runner import JobRunner

__all__ = ["JobRunner"]
