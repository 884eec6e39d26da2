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

import math
import os
import time

from google.protobuf.message import DecodeError

from antdt_tf import limits
from antdt_tf.errors import CorruptState, InvalidRequest, shown
from antdt_tf.monitor.straggler import (DETERMINISTIC, NORMAL, NOT_ENOUGH, PERSISTENT,
                                        TRANSIENT, StragglerClassifier, StragglerConfig)
from antdt_tf.proto import cluster_pb2 as cpb

_CLASS = {NORMAL: cpb.TaskHealth.NORMAL, TRANSIENT: cpb.TaskHealth.TRANSIENT,
          PERSISTENT: cpb.TaskHealth.PERSISTENT, DETERMINISTIC: cpb.TaskHealth.DETERMINISTIC}
_CLASS_NAME = {v: k for k, v in _CLASS.items()}


def straggler_class_name(value: int) -> str:
    """The Monitor's class (``monitor.straggler``: "normal", "transient", ...) of a
    ``TaskHealth.straggler_class``; "unknown" while there are too few samples."""
    return _CLASS_NAME.get(value, NOT_ENOUGH)

KNOWN_JOBS = ("ps", "worker", "chief", "master")


def _check_task(ref: cpb.TaskRef) -> None:
    if ref.job not in KNOWN_JOBS:
        raise InvalidRequest(f"unknown job {shown(ref.job)}; expected one of {KNOWN_JOBS}")
    if not 0 <= ref.index <= limits.MAX_TASK_INDEX:
        raise InvalidRequest(f"task index must be in [0, {limits.MAX_TASK_INDEX}], "
                             f"got {ref.index}")


def _check_size(msg, limit: int, what: str) -> None:
    if msg.ByteSize() > limit:
        raise InvalidRequest(f"{what} takes {msg.ByteSize()} bytes, at most {limit} allowed")


def _check_text(value: str, limit: int, what: str) -> None:
    if len(value) > limit or "\0" in value:
        raise InvalidRequest(f"{what} {shown(value)} is longer than {limit} characters "
                             "or holds a NUL character")


def _check_numbers(msg, what: str) -> None:
    """Every double of ``msg`` (not nested) is finite."""
    for field, value in msg.ListFields():
        if field.type == field.TYPE_DOUBLE and not math.isfinite(value):
            raise InvalidRequest(f"{what}.{field.name} must be a finite number, got {value}")


def _check_address(address: str, what: str) -> None:
    _check_text(address, limits.MAX_ADDRESS_CHARS, what)
    if ":" not in address:
        raise InvalidRequest(f"{what} {shown(address)} is not host:port")


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

    def configure_straggler(self, config: StragglerConfig) -> None:
        """The submitted job's straggler settings (a master serves one job); what was
        observed so far is dropped, as the judgement's windows would not match."""
        if config != self.classifier.config:
            self.classifier = StragglerClassifier(config)

    def observe_step(self, worker: int, incarnation: int, records: int,
                     seconds: float | None = None, steps: int = 1) -> None:
        """A worker reported a trained batch (called by the master for every report);
        ``seconds``: the step's time as the worker measured it (BSP mode)."""
        self.classifier.observe_step(worker, incarnation, self._clock(), records, seconds,
                                     steps)

    def report_agent(self, report: cpb.AgentReport) -> bool:
        if not report.host:
            raise InvalidRequest("AgentReport.host is empty")
        _check_size(report, limits.MAX_AGENT_REPORT_BYTES, "the AgentReport")
        _check_text(report.host, limits.MAX_HOST_CHARS, "AgentReport.host")
        _check_text(report.agent_address, limits.MAX_ADDRESS_CHARS, "AgentReport.agent_address")
        _check_text(report.advertise, limits.MAX_HOST_CHARS, "AgentReport.advertise")
        if report.seq < 1:
            raise InvalidRequest(f"AgentReport.seq must be >= 1, got {report.seq}")
        _check_numbers(report, "AgentReport")
        if report.load_per_cpu < 0:
            raise InvalidRequest(f"AgentReport.load_per_cpu must be >= 0, got "
                                 f"{report.load_per_cpu}")
        if not (0 <= report.first_task_port <= 65535 and 0 <= report.last_task_port <= 65535):
            raise InvalidRequest("AgentReport task ports must be in [0, 65535]")
        for status in report.tasks:
            _check_task(status.task)
            _check_numbers(status, "TaskStatus")
        if report.host not in self._agents:
            if len(self._agents) >= limits.MAX_AGENTS:
                raise InvalidRequest(f"reports of {len(self._agents)} hosts are kept already, "
                                     f"at most {limits.MAX_AGENTS}; host {shown(report.host)} "
                                     "is refused")
        kept_bytes = sum(r.ByteSize() for h, r in self._agents.items() if h != report.host)
        if kept_bytes + report.ByteSize() > limits.MAX_AGENT_REPORTS_BYTES:
            raise InvalidRequest(f"the agents' reports would take more than "
                                 f"{limits.MAX_AGENT_REPORTS_BYTES} bytes")
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
        _check_size(report, limits.MAX_TRAINER_REPORT_BYTES, "the TrainerReport")
        _check_numbers(report, "TrainerReport")
        if report.seq < 1:
            raise InvalidRequest(f"TrainerReport.seq must be >= 1, got {report.seq}")
        if report.incarnation < 0:
            raise InvalidRequest(f"TrainerReport.incarnation must be >= 0, got "
                                 f"{report.incarnation}")
        if any(not 0 <= w.worker <= limits.MAX_TASK_INDEX or w.shards < 0 or w.records < 0
               for w in report.workers):
            raise InvalidRequest(f"WorkerStats must be non-negative (worker at most "
                                 f"{limits.MAX_TASK_INDEX})")
        if any(not 0 <= p.ps <= limits.MAX_PS or not 0 <= p.latency_ms < math.inf
               for p in report.ps_latency):
            raise InvalidRequest(f"PsLatency must have ps in [0, {limits.MAX_PS}] and a "
                                 "finite latency_ms >= 0")
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
        if not 1 <= cluster.version <= limits.MAX_COUNTER:
            raise InvalidRequest(f"JobCluster.version must be in [1, {limits.MAX_COUNTER}], "
                                 f"got {cluster.version}")
        if not cluster.chief or not cluster.ps or not cluster.worker:
            raise InvalidRequest("JobCluster needs chief, ps and worker addresses")
        for job in ("chief", "ps", "worker"):
            addresses = getattr(cluster, job)
            if len(addresses) > limits.MAX_CLUSTER_TASKS:
                raise InvalidRequest(f"JobCluster.{job}: {len(addresses)} addresses, at most "
                                     f"{limits.MAX_CLUSTER_TASKS} allowed")
            for a in addresses:
                _check_address(a, f"JobCluster.{job} address")
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
