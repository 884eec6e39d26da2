"""Recovery: a task that is not running is restarted (on another host when its host is
lost), the leases of a dead worker go back, and each failure's recovery is timed
(``faults.FaultClock``). Part of :class:`~antdt_tf.master.runner.JobRunner`.

- a worker that died is restarted on its address; TensorFlow re-joins it and re-runs its
  closure; on a new address (its host lost) the chief restarts with the new cluster;
- a PS that died is restarted; the chief, which cannot continue without it, exits 75 and
  is relaunched once every PS and worker runs again, restoring the last checkpoint;
- a chief that died is relaunched (same restore);
- a TF1 job's PS that died fails the job at once (no TF1 PS recovery here).
"""

from __future__ import annotations

import signal
import time

from antdt_tf.errors import AntdtError
from antdt_tf.exitcodes import CLUSTER_UNAVAILABLE
from antdt_tf.master.runner.faults import FaultClock


class Recovery:
    """What the runner does about tasks that stopped, and its view of the master's
    progress."""

    def _recover(self, key, status, statuses) -> None:
        """``job:index`` is not running (``status``): restart it (within
        ``--max_restarts``), or wait (a chief that exited 75 waits for its cluster)."""
        job, index = key
        name = "coordinator" if job == "chief" else f"{job}:{index}"
        from antdt_tf.backends import FailureKind, TaskState

        failure = status.failure
        if status.state is TaskState.STOPPED:
            how = "killed"
        elif failure is None:
            how = "exit 0"
        elif failure.kind is FailureKind.EXITED:
            how = f"exit {failure.exit_code}"
        elif failure.kind is FailureKind.KILLED:
            how = f"signal {signal.Signals(-failure.exit_code).name}"
        else:
            how = str(failure)
        if (job == "chief" and failure is not None and failure.kind is FailureKind.EXITED
                and failure.exit_code == CLUSTER_UNAVAILABLE):
            # wait until every PS and worker runs again, then relaunch (it restores)
            if any(not s.running for k, s in statuses.items() if k[0] in ("ps", "worker")):
                return
        if job == "ps" and self.cfg.tf1:
            # TF1 between-graph here has no PS recovery: its trainers would wait on the
            # lost PS (or its old address) until the job's timeout. Say so at once.
            raise RuntimeError(f"{name} {how}: a TF1 job (--api={self.cfg.api}) does not "
                               "survive the loss of a PS (docs/program.md); the job stops "
                               f"here. Log: {status.log_path}")
        n = self.restarts.get(key, 0) + 1
        if n > self.cfg.max_restarts:
            raise RuntimeError(f"{name} failed {n} times ({how}); giving up. Log: "
                               f"{status.log_path}")
        self.restarts[key] = n
        self.restarting[key] = self.issued.get(key, 0) + 1
        ev = self._event(f"{name} {how}; restarting it (restart {n})", task=name,
                         failure=how)
        self.pending_faults.append(FaultClock(ev, time.monotonic(), self._records_done()))
        if job == "worker":
            self._release_leases_of(index)
        if self.placement[key] not in self.live_hosts():
            # its host is lost: another host, another address
            self.placement[key] = self._other_host(job, index)
            self._event(f"{name} moves to {self.host_name(self.placement[key])}")
        address = self.spec[job][index] if job in self.spec else ""
        self.start_task(job, index)
        self.restarting.pop(key, None)
        if job == "chief":
            records = self._records_done()
            for fault in self.pending_faults:
                fault.chief_started(records)
        if (job == "worker" and index < self.active_workers and not self.cfg.tf1
                and self.spec[job][index] != address):
            # TF re-joins a worker only at its old address: the chief comes back with
            # the new cluster and restores the last checkpoint
            self._event(f"{name} has a new address: restarting the chief with the new "
                        "cluster")
            if statuses.get(("chief", 0)) is not None and statuses["chief", 0].running:
                self.stop_task("chief", 0, kill=True)

    def _hold_data(self, hold: bool) -> bool:
        """Holds (no new lease) or resumes the job's dataset; True when it took effect."""
        try:
            self.admin.set_paused("train", hold)
        except AntdtError as e:
            self._event(f"could not {'hold' if hold else 'resume'} the data: {e}")
            return False
        self._event("data held while the injected action starts its tasks" if hold
                    else "data resumed")
        return True

    def _release_leases_of(self, worker: int) -> None:
        """A dead worker's pipeline held leases (pull path): give them back now rather
        than when their lease runs out, so the live workers take them over."""
        from antdt_tf.sharding.client import Task

        try:
            for t in self.admin.progress("train").tasks:
                if t.task.type == "worker" and t.task.index == worker and t.state != "dead":
                    n = self.admin.report_task_failure(Task("worker", worker, t.task.incarnation),
                                                       reason="process died (agent)")
                    if n:
                        self._event(f"worker:{worker}'s {n} lease(s) released (back to "
                                    "TODO; sparse ones held for the chief to settle)")
        except AntdtError as e:
            self._event(f"could not release worker:{worker}'s leases: {e}")

    def _master_progress(self):
        """The master's GetProgress of the job's dataset, None when it did not answer."""
        try:
            return self.admin.progress("train")
        except AntdtError:
            return None

    def _dataset_progress(self):
        p = self._master_progress()
        return p.datasets[0] if p is not None else None

    def _records_done(self) -> int:
        p = self._dataset_progress()
        return p.records_done_total if p is not None else 0
