"""ClusterView: the latest liveness and per-worker numbers, as the master knows them.

Reports arrive over the network, so they can be late, duplicated or malformed. Each
reporter numbers its reports (``seq``, per reporter process); a report older than the
last accepted one is ignored, so a delayed report never overwrites a newer picture.
A reporter that restarted (new process) starts again from seq 1: agents send their
``agent_address`` and trainers their incarnation, and a new one resets the sequence.
"""

from __future__ import annotations

import time

from antdt_tf.errors import InvalidRequest
from antdt_tf.proto import cluster_pb2 as cpb

KNOWN_JOBS = ("ps", "worker", "chief", "master")


def _check_task(ref: cpb.TaskRef) -> None:
    if ref.job not in KNOWN_JOBS:
        raise InvalidRequest(f"unknown job {ref.job!r}; expected one of {KNOWN_JOBS}")
    if ref.index < 0:
        raise InvalidRequest(f"task index must be >= 0, got {ref.index}")


class ClusterView:
    def __init__(self, clock=time.time):
        self._clock = clock
        self._agents: dict[str, cpb.AgentReport] = {}
        self._trainer: cpb.TrainerReport | None = None

    def report_agent(self, report: cpb.AgentReport) -> bool:
        if not report.host:
            raise InvalidRequest("AgentReport.host is empty")
        if report.seq < 1:
            raise InvalidRequest(f"AgentReport.seq must be >= 1, got {report.seq}")
        for status in report.tasks:
            _check_task(status.task)
        last = self._agents.get(report.host)
        if (last is not None and last.agent_address == report.agent_address
                and report.seq <= last.seq):
            return False
        kept = cpb.AgentReport()
        kept.CopyFrom(report)
        kept.unix_time = self._clock()   # when the master heard it (clocks differ per host)
        self._agents[report.host] = kept
        return True

    def report_trainer(self, report: cpb.TrainerReport) -> bool:
        _check_task(report.task)
        if report.seq < 1:
            raise InvalidRequest(f"TrainerReport.seq must be >= 1, got {report.seq}")
        if any(w.worker < 0 or w.shards < 0 or w.records < 0 for w in report.workers):
            raise InvalidRequest("WorkerStats must be non-negative")
        last = self._trainer
        if last is not None:
            if report.incarnation < last.incarnation:
                return False
            if report.incarnation == last.incarnation and report.seq <= last.seq:
                return False
        kept = cpb.TrainerReport()
        kept.CopyFrom(report)
        kept.unix_time = self._clock()
        self._trainer = kept
        return True

    def status(self) -> cpb.ClusterStatus:
        out = cpb.ClusterStatus(unix_time=self._clock())
        out.agents.extend(self._agents[h] for h in sorted(self._agents))
        if self._trainer is not None:
            out.trainer.CopyFrom(self._trainer)
        return out
