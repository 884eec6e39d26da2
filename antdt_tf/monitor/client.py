"""MonitorClient: report to / read from the master's antdt.v1.ClusterMonitor."""

from __future__ import annotations

import itertools
from typing import Optional

import grpc

from antdt_tf import auth
from antdt_tf.proto import cluster_pb2 as cpb
from antdt_tf.proto import cluster_pb2_grpc as cpb_grpc


class MonitorClient:
    """Thread-safe. Reports are numbered here (``seq``), so the master can drop late ones."""

    def __init__(self, address: str = "", channel: Optional[grpc.Channel] = None,
                 timeout: float = 10.0, stub=None):
        """``stub``: the master's monitor servicer in this process (``rpc.LoopStub``)."""
        if channel is None and not address and stub is None:
            raise ValueError("MonitorClient needs an address, a channel or a stub")
        self._own_channel = channel is None and stub is None
        self._channel = None if stub is not None else channel or auth.channel(address)
        self._stub = stub if stub is not None else cpb_grpc.ClusterMonitorStub(self._channel)
        self.timeout = timeout
        self._seq = itertools.count(1)

    def _call(self, method: str, request, wait: bool):
        from antdt_tf.rpc import raise_typed

        try:
            return getattr(self._stub, method)(request, timeout=self.timeout,
                                               wait_for_ready=wait)
        except grpc.RpcError as e:
            raise_typed(e, method)

    def report_agent(self, host: str, agent_address: str, tasks, advertise: str = "",
                     task_ports: tuple[int, int] = (0, 0), load_per_cpu: float = 0.0) -> bool:
        report = cpb.AgentReport(host=host, agent_address=agent_address, seq=next(self._seq),
                                 advertise=advertise, first_task_port=task_ports[0],
                                 last_task_port=task_ports[1], load_per_cpu=load_per_cpu)
        report.tasks.extend(tasks)
        return self._call("ReportAgent", report, wait=False).accepted

    def report_trainer(self, incarnation: int, workers: list[tuple[int, int]],
                       task: cpb.TaskRef = cpb.TaskRef(job="chief", index=0),
                       ps_latency_ms: Optional[dict[int, float]] = None) -> bool:
        """``workers[i] = (shards, records)`` trained by worker ``i``; ``ps_latency_ms``
        the latest probe of every PS (``antdt_tf.tf.ps_probe``)."""
        report = cpb.TrainerReport(task=task, incarnation=incarnation, seq=next(self._seq))
        report.workers.extend(cpb.WorkerStats(worker=i, shards=s, records=r)
                              for i, (s, r) in enumerate(workers))
        report.ps_latency.extend(cpb.PsLatency(ps=i, latency_ms=ms)
                                 for i, ms in sorted((ps_latency_ms or {}).items()))
        return self._call("ReportTrainer", report, wait=False).accepted

    def set_job_cluster(self, version: int, spec: dict) -> cpb.JobCluster:
        """Publishes the job's TF addresses (``{"chief": [...], "ps": [...], "worker":
        [...]}``); returns the cluster in force (a stale version is not applied)."""
        return self._call("SetJobCluster", cpb.JobCluster(
            version=version, chief=spec["chief"], ps=spec["ps"], worker=spec["worker"]),
            wait=True)

    def job_cluster(self) -> cpb.JobCluster:
        return self._call("GetJobCluster", cpb.GetJobClusterRequest(), wait=True)

    def master_info(self) -> cpb.MasterInfo:
        return self._call("GetMasterInfo", cpb.GetMasterInfoRequest(), wait=True)

    def status(self) -> cpb.ClusterStatus:
        return self._call("GetClusterStatus", cpb.ClusterStatusRequest(), wait=True)

    def close(self) -> None:
        if self._own_channel:
            self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
