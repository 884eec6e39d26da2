"""AgentClient: what the launcher (and the controller) use to act through an agent."""

from __future__ import annotations

from typing import Optional

import grpc

from antdt_tf import errors
from antdt_tf.proto import cluster_pb2 as cpb
from antdt_tf.proto import cluster_pb2_grpc as cpb_grpc


class AgentUnavailable(errors.AntdtError):
    """The agent could not be reached within the call's deadline."""


class AgentClient:
    def __init__(self, address: str, timeout: float = 30.0):
        self.address = address
        self.timeout = timeout
        self._channel = grpc.insecure_channel(address)
        self._stub = cpb_grpc.AgentStub(self._channel)

    def _call(self, method: str, request, timeout: Optional[float] = None):
        from antdt_tf.sharding.client import _raise_typed

        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout,
                                               wait_for_ready=True)
        except grpc.RpcError as e:
            _raise_typed(e, f"agent {self.address} {method}", AgentUnavailable)

    def start(self, job: str, index: int, program: str, args=(), env=None) -> cpb.TaskStatus:
        return self._call("StartTask", cpb.StartTaskRequest(
            task=cpb.TaskRef(job=job, index=index), program=program, args=list(args),
            env=dict(env or {})))

    def stop(self, job: str, index: int, kill: bool = False,
             grace_seconds: float = 10.0) -> cpb.TaskStatus:
        return self._call("StopTask", cpb.StopTaskRequest(
            task=cpb.TaskRef(job=job, index=index), kill=kill, grace_seconds=grace_seconds),
            timeout=grace_seconds + 30)

    def throttle(self, job: str, index: int, slowdown: float,
                 duration_seconds: float = 0.0) -> cpb.TaskStatus:
        return self._call("ThrottleTask", cpb.ThrottleTaskRequest(
            task=cpb.TaskRef(job=job, index=index), slowdown=slowdown,
            duration_seconds=duration_seconds))

    def list(self) -> cpb.ListTasksResponse:
        return self._call("ListTasks", cpb.ListTasksRequest())

    def close(self) -> None:
        self._channel.close()
