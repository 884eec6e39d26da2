"""ClusterView: the latest liveness and per-worker numbers, as the master knows them.

Reports arrive over the network, so they can be late, duplicated or malformed. Each
reporter numbers its reports (``seq``, per reporter process); a report older than the
last accepted one is ignored, so a delayed report never overwrites a newer picture.
A reporter that restarted (new process) starts again from seq 1: agents send their
``agent_address`` and trainers their incarnation, and a new one resets the sequence.

It also holds the straggler judgement (``antdt_tf.monitor.straggler``): the master feeds
every worker's step reports into it, the trainer's reports bring the PS probe latencies.
"""

from __future__ import annotations

import os
import time

from google.protobuf.message import DecodeError

from antdt_tf.errors import CorruptState, InvalidRequest
from antdt_tf.monitor.straggler import (DETERMINISTIC, NORMAL, PERSISTENT, TRANSIENT,
                                        StragglerClassifier, StragglerConfig)
from antdt_tf.proto import cluster_pb2 as cpb

_CLASS = {NORMAL: cpb.TaskHealth.NORMAL, TRANSIENT: cpb.TaskHealth.TRANSIENT,
          PERSISTENT: cpb.TaskHealth.PERSISTENT, DETERMINISTIC: cpb.TaskHealth.DETERMINISTIC}

KNOWN_JOBS = ("ps", "worker", "chief", "master")


def _check_task(ref: cpb.TaskRef) -> None:
    if ref.job not in KNOWN_JOBS:
        raise InvalidRequest(f"unknown job {ref.job!r}; expected one of {KNOWN_JOBS}")
    if ref.index < 0:
        raise InvalidRequest(f"task index must be >= 0, got {ref.index}")


class ClusterView:
    def __init__(self, clock=time.time, straggler: StragglerConfig = StragglerConfig(),
                 cluster_file: str = ""):
        self._clock = clock
        self._agents: dict[str, cpb.AgentReport] = {}
        # the job's TF addresses (SetJobCluster), kept in cluster_file so that a
        # restarted master still knows them
        self._cluster_file = cluster_file
        self._cluster = cpb.JobCluster()
        if cluster_file and os.path.exists(cluster_file):
            try:
                with open(cluster_file, "rb") as f:
                    self._cluster.ParseFromString(f.read())
            except (OSError, DecodeError) as e:
                raise CorruptState(f"{cluster_file}: cannot read the job cluster: {e}") from e
        self._trainer: cpb.TrainerReport | None = None
        self.classifier = StragglerClassifier(straggler)

    def observe_step(self, worker: int, incarnation: int, records: int,
                     seconds: float | None = None, steps: int = 1) -> None:
        """A worker reported a trained batch (called by the master for every report);
        ``seconds``: the step's time as the worker measured it (BSP mode)."""
        self.classifier.observe_step(worker, incarnation, self._clock(), records, seconds,
                                     steps)

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
        if any(p.ps < 0 or not p.latency_ms >= 0 for p in report.ps_latency):
            raise InvalidRequest("PsLatency must have ps >= 0 and latency_ms >= 0")
        last = self._trainer
        if last is not None:
            if report.incarnation < last.incarnation:
                return False
            if report.incarnation == last.incarnation and report.seq <= last.seq:
                return False
        if last is None or report.incarnation != last.incarnation:
            self.classifier.forget_ps()   # a new chief: the PS probes start over
        kept = cpb.TrainerReport()
        kept.CopyFrom(report)
        kept.unix_time = self._clock()
        self._trainer = kept
        for p in report.ps_latency:
            self.classifier.observe_ps_latency(p.ps, kept.unix_time, p.latency_ms)
        return True

    def set_job_cluster(self, cluster: cpb.JobCluster) -> cpb.JobCluster:
        if cluster.version < 1:
            raise InvalidRequest(f"JobCluster.version must be >= 1, got {cluster.version}")
        if not cluster.chief or not cluster.ps or not cluster.worker:
            raise InvalidRequest("JobCluster needs chief, ps and worker addresses")
        if any(not a or ":" not in a for a in (*cluster.chief, *cluster.ps, *cluster.worker)):
            raise InvalidRequest("every JobCluster address must be host:port")
        if cluster.version <= self._cluster.version:
            return self._cluster            # stale: the one in force
        if self._cluster_file:
            tmp = f"{self._cluster_file}.tmp"
            with open(tmp, "wb") as f:
                f.write(cluster.SerializeToString())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._cluster_file)
        self._cluster = cpb.JobCluster()
        self._cluster.CopyFrom(cluster)
        return self._cluster

    def job_cluster(self) -> cpb.JobCluster:
        return self._cluster

    def tick(self) -> None:
        """Judge now (the master calls this every tick): a slow episode's start is
        noted when it starts, not when someone first asks."""
        self.classifier.judge(self._clock())

    def health(self) -> list[cpb.TaskHealth]:
        out = []
        for j in self.classifier.judge(self._clock()):
            out.append(cpb.TaskHealth(
                task=cpb.TaskRef(job=j.job, index=j.index),
                straggler_class=_CLASS.get(j.straggler_class,
                                           cpb.TaskHealth.STRAGGLER_CLASS_UNSPECIFIED),
                slowness=j.slowness, step_seconds=j.step_seconds,
                records_per_second=j.records_per_second, latency_ms=j.latency_ms,
                slow_since_unix=j.slow_since, samples=j.samples, incarnation=j.incarnation))
        return out

    def status(self) -> cpb.ClusterStatus:
        out = cpb.ClusterStatus(unix_time=self._clock())
        out.agents.extend(self._agents[h] for h in sorted(self._agents))
        if self._trainer is not None:
            out.trainer.CopyFrom(self._trainer)
        out.health.extend(self.health())
        return out
