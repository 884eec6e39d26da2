"""AgentClient: what the master's job runner (its backends) uses to act through an agent:
to start its tasks and to carry out the Controller's actions."""

from __future__ import annotations

from typing import Optional

import grpc

from antdt_tf import auth, errors
from antdt_tf.proto import cluster_pb2 as cpb
from antdt_tf.proto import cluster_pb2_grpc as cpb_grpc


class AgentUnavailable(errors.AntdtError):
    """The agent could not be reached within the call's deadline."""


class AgentClient:
    def __init__(self, address: str, timeout: float = 30.0,
                 channel: Optional[grpc.Channel] = None):
        self.address = address
        self.timeout = timeout
        self._channel = channel or auth.channel(address)
        self._stub = cpb_grpc.AgentStub(self._channel)

    def _call(self, method: str, request, timeout: Optional[float] = None,
              wait_for_ready: bool = True):
        from antdt_tf.rpc import raise_typed

        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout,
                                               wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise_typed(e, f"agent {self.address} {method}", AgentUnavailable)

    def start(self, job: str, index: int, program: int, args, generation: int = 0,
              endpoint: str = "", memory_limit_bytes: int = 0) -> cpb.TaskStatus:
        """Starts ``program`` (``cpb.Program``) with its typed ``args`` (``TfServerArgs``,
        ``ChiefArgs``, ``Tf1TrainerArgs`` or ``ProbeTaskArgs``)."""
        return self._call("StartTask", start_request(job, index, program, args, generation,
                                                     endpoint, memory_limit_bytes))

    def stop(self, job: str, index: int, kill: bool = False, grace_seconds: float = 10.0,
             generation: int = 0) -> cpb.TaskStatus:
        return self._call("StopTask", cpb.StopTaskRequest(
            task=cpb.TaskRef(job=job, index=index), kill=kill, grace_seconds=grace_seconds,
            generation=generation), timeout=grace_seconds + 30)

    def throttle(self, job: str, index: int, slowdown: float,
                 duration_seconds: float = 0.0) -> cpb.TaskStatus:
        return self._call("ThrottleTask", cpb.ThrottleTaskRequest(
            task=cpb.TaskRef(job=job, index=index), slowdown=slowdown,
            duration_seconds=duration_seconds))

    def list(self, timeout: Optional[float] = None) -> cpb.ListTasksResponse:
        """The agent's tasks. With ``timeout``, fail fast when the agent is unreachable
        (a liveness check) instead of waiting for it to come up."""
        return self._call("ListTasks", cpb.ListTasksRequest(), timeout=timeout,
                          wait_for_ready=timeout is None)

    def close(self) -> None:
        self._channel.close()


# typed arguments message -> its field in StartTaskRequest's ``args`` oneof
_ARGS_FIELD = {f.message_type.name: f.name
               for f in cpb.StartTaskRequest.DESCRIPTOR.oneofs_by_name["args"].fields}


def start_request(job: str, index: int, program: int, args, generation: int = 0,
                  endpoint: str = "", memory_limit_bytes: int = 0) -> cpb.StartTaskRequest:
    """The typed ``StartTask`` for ``program`` with its ``args`` message (what every
    backend hands the process that supervises a task)."""
    req = cpb.StartTaskRequest(task=cpb.TaskRef(job=job, index=index), program=program,
                               generation=generation, endpoint=endpoint,
                               memory_limit_bytes=memory_limit_bytes)
    field = _ARGS_FIELD.get(type(args).__name__)
    if field is None:
        raise TypeError(f"args must be one of {sorted(_ARGS_FIELD)}, got {type(args)}")
    getattr(req, field).CopyFrom(args)
    return req
