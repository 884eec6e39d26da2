"""The gRPC face of the sharding service: a thin servicer over :class:`ShardState`.

Handlers validate, call the core, persist through the store and map domain errors to
status codes in one place (``ERROR_CODES``). The error's class name travels in the
``antdt-error`` trailing metadata so clients re-raise the same type without parsing
messages. Requests that do not even parse are answered INVALID_ARGUMENT (gRPC's own
deserializer would answer INTERNAL).

The server is ``grpc.aio``: one event loop owns the state, so no lock is needed and the
journal is written in the same order the events are applied.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Optional

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from antdt_tf.errors import (ERROR_METADATA_KEY, AntdtError, DatasetConflict,
                             IncompatibleState, InvalidRequest, LeaseNotHeld, StaleGeneration,
                             StaleIncarnation, TaskAlreadyRunning, UnknownDataset, UnknownTask)
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.state import ShardState, spec_from_proto
from antdt_tf.sharding.store import StateStore

log = logging.getLogger(__name__)

SERVICE_NAME = "antdt.v1.ShardingService"
ERROR_CODES: dict[type, grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownDataset: grpc.StatusCode.NOT_FOUND,
    UnknownTask: grpc.StatusCode.NOT_FOUND,
    DatasetConflict: grpc.StatusCode.ALREADY_EXISTS,
    StaleIncarnation: grpc.StatusCode.FAILED_PRECONDITION,
    LeaseNotHeld: grpc.StatusCode.FAILED_PRECONDITION,
    IncompatibleState: grpc.StatusCode.FAILED_PRECONDITION,
    TaskAlreadyRunning: grpc.StatusCode.FAILED_PRECONDITION,
    StaleGeneration: grpc.StatusCode.FAILED_PRECONDITION,
}


# so_reuseport=0: a second master on the same port fails instead of sharing it.
SERVER_OPTIONS = [("grpc.so_reuseport", 0), ("grpc.http2.bdp_probe", 0),
                  ("grpc.enable_channelz", 0)]


class _Malformed:
    """Stands in for a request whose bytes did not parse."""

    def __init__(self, error: str):
        self.error = error


def _lenient_parser(cls):
    def parse(data: bytes):
        msg = cls()
        try:
            msg.ParseFromString(data)
        except DecodeError as e:
            return _Malformed(f"{e}")
        return msg
    return parse


class ShardingServicer:
    """Implements antdt.v1.ShardingService over a ShardState (and its store)."""

    # ADJUST_BS never asks a worker for more than this many records in one batch
    MAX_BATCH_SIZE = 1 << 20

    def __init__(self, state: ShardState, store: Optional[StateStore] = None):
        self.state = state
        self.store = store
        # ADJUST_BS: dataset -> {worker index: records per batch}; the Controller's soft
        # state (not journaled: after a restart it sets the sizes again)
        self.batch_sizes: dict[str, dict[int, int]] = {}
        self.paused: set[str] = set()     # SetPaused: datasets issuing no new lease

    def RegisterDataset(self, req: pb.RegisterDatasetRequest) -> pb.RegisterDatasetResponse:
        created, shards, records = self.state.register_dataset(spec_from_proto(req.spec))
        return pb.RegisterDatasetResponse(created=created, num_shards=shards, num_records=records)

    def GetShard(self, req: pb.GetShardRequest) -> pb.GetShardResponse:
        if not req.HasField("task"):
            raise InvalidRequest("GetShard needs the requesting task")
        if req.dataset in self.paused:
            return self.paused_answer(req.dataset)
        return self.state.get_shard(req.dataset, req.task, req.request_id)

    def paused_answer(self, dataset: str) -> pb.GetShardResponse:
        self.state.lease_length(dataset, -1)      # raises UnknownDataset
        return pb.GetShardResponse(status=pb.GetShardResponse.WAIT, retry_after_seconds=0.2)

    def SetPaused(self, req: pb.SetPausedRequest) -> pb.SetPausedResponse:
        self.state.lease_length(req.dataset, -1)      # raises UnknownDataset
        (self.paused.add if req.paused else self.paused.discard)(req.dataset)
        log.info("dataset %s %s", req.dataset, "paused" if req.paused else "resumed")
        return pb.SetPausedResponse(paused=req.paused)

    def ReportShard(self, req: pb.ReportShardRequest) -> pb.ReportShardResponse:
        if not req.HasField("task"):
            raise InvalidRequest("ReportShard needs the reporting task")
        return self.state.report_shard(req)

    def ReportTaskFailure(self, req: pb.ReportTaskFailureRequest) -> pb.ReportTaskFailureResponse:
        if not req.HasField("task"):
            raise InvalidRequest("ReportTaskFailure needs the failed task")
        released = self.state.report_task_failure(req.task)
        if released:
            log.warning("task %s:%d#%d reported dead (%s): %d shard(s) back to TODO",
                        req.task.type, req.task.index, req.task.incarnation,
                        req.reason or "no reason given", released)
        return pb.ReportTaskFailureResponse(released_shards=released)

    def GetProgress(self, req: pb.GetProgressRequest) -> pb.GetProgressResponse:
        out = self.state.progress(req.dataset)
        for d in out.datasets:
            d.batch_sizes.update(self.batch_sizes.get(d.name, {}))
            d.paused = d.name in self.paused
        return out

    def ApplyLeaseRecord(self, req: pb.LeaseRecord) -> pb.LeaseRecordResponse:
        if not req.HasField("holder"):
            raise InvalidRequest("ApplyLeaseRecord needs the lease's holder")
        applied = self.state.apply_record(req.dataset, req.lease_id, req.holder,
                                          req.records_applied)
        return pb.LeaseRecordResponse(applied=applied)

    def SetBatchSizes(self, req: pb.SetBatchSizesRequest) -> pb.SetBatchSizesResponse:
        self.state.lease_length(req.dataset, -1)      # raises UnknownDataset
        for worker, size in req.batch_sizes.items():
            if worker < 0:
                raise InvalidRequest(f"worker index must be >= 0, got {worker}")
            if not 0 < size <= self.MAX_BATCH_SIZE:
                raise InvalidRequest(f"batch size of worker {worker} must be in "
                                     f"[1, {self.MAX_BATCH_SIZE}], got {size}")
        sizes = {} if req.replace else dict(self.batch_sizes.get(req.dataset, {}))
        sizes.update(req.batch_sizes)
        self.batch_sizes[req.dataset] = sizes
        log.info("batch sizes of %s: %s", req.dataset, sizes)
        return pb.SetBatchSizesResponse(batch_sizes=sizes)

    def batch_size_of(self, dataset: str, worker: int) -> int:
        """The Controller's batch size for ``worker`` (0: the trainer's default)."""
        return self.batch_sizes.get(dataset, {}).get(worker, 0)

    def SaveState(self, req: pb.SaveStateRequest) -> pb.SaveStateResponse:
        return pb.SaveStateResponse(state=self.state.snapshot(req.datasets, with_tasks=False,
                                                              for_checkpoint=True))

    def RestoreState(self, req: pb.RestoreStateRequest) -> pb.RestoreStateResponse:
        names, requeued = self.state.restore_state(req.state)
        log.info("restored sharding state of %s (%d leased shard(s) back to TODO)", names, requeued)
        return pb.RestoreStateResponse(datasets=names, requeued_shards=requeued)

    def stream_call(self, request) -> pb.ShardStreamResponse:
        """Answers one ShardStream message exactly as the unary call would."""
        if isinstance(request, _Malformed):
            return pb.ShardStreamResponse(error=pb.CallError(
                code=grpc.StatusCode.INVALID_ARGUMENT.value[0], type="InvalidRequest",
                message=f"malformed request: {request.error}"))
        kind = request.WhichOneof("call")
        try:
            if kind == "get_shard":
                return pb.ShardStreamResponse(seq=request.seq,
                                              get_shard=self.GetShard(request.get_shard))
            if kind == "report_shard":
                return pb.ShardStreamResponse(seq=request.seq,
                                              report_shard=self.ReportShard(request.report_shard))
            raise InvalidRequest("ShardStream message carries no call (get_shard or report_shard)")
        except AntdtError as e:
            return pb.ShardStreamResponse(seq=request.seq, error=pb.CallError(
                code=status_of(e).value[0], type=type(e).__name__, message=str(e)))

    def after_call(self) -> None:
        if self.store is not None and self.store.needs_snapshot:
            self.store.write_snapshot(self.state.snapshot())

    def tick(self) -> None:
        """Periodic work: take back expired leases, flush the journal."""
        expired = self.state.expire_leases()
        if expired:
            log.warning("%d lease(s) expired: their shards are TODO again: %s", expired,
                        "; ".join(self.state.last_expired))
        if self.store is not None:
            self.after_call()
            self.store.sync()


def status_of(error: AntdtError) -> grpc.StatusCode:
    return next((c for t, c in ERROR_CODES.items() if isinstance(error, t)),
                grpc.StatusCode.INTERNAL)


def _aio_handler(fn: Callable, after: Callable[[], None]):
    async def handle(request, context: grpc.aio.ServicerContext):
        if isinstance(request, _Malformed):
            context.set_trailing_metadata(((ERROR_METADATA_KEY, "InvalidRequest"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"malformed request: {request.error}")
        try:
            response = fn(request)
        except AntdtError as e:
            context.set_trailing_metadata(((ERROR_METADATA_KEY, type(e).__name__),))
            await context.abort(status_of(e), str(e))
        after()
        return response
    return handle


def _stream_handler(servicer: "ShardingServicer"):
    """ShardStream: read a call, answer it, repeat. Errors are answered in-stream
    (CallError) and the stream stays open; only the peer closes it."""
    async def handle(request_iterator, context: grpc.aio.ServicerContext):
        while True:
            request = await context.read()
            if request is grpc.aio.EOF:
                return
            await context.write(servicer.stream_call(request))
            servicer.after_call()
    return handle


def unary_handlers(service, servicer, after: Callable[[], None] = lambda: None) -> dict:
    """gRPC handlers for the unary methods of ``service`` (a protobuf ServiceDescriptor)
    implemented by the same-named methods of ``servicer``: lenient parsing, domain
    errors mapped to status codes, ``after()`` once a call succeeded."""
    handlers = {}
    for method in service.methods:
        if method.client_streaming or method.server_streaming:
            continue
        request_cls = message_factory.GetMessageClass(method.input_type)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _aio_handler(getattr(servicer, method.name), after),
            request_deserializer=_lenient_parser(request_cls),
            response_serializer=lambda m: m.SerializeToString())
    return handlers


def generic_handler(servicer: ShardingServicer) -> grpc.GenericRpcHandler:
    service = pb.DESCRIPTOR.services_by_name["ShardingService"]
    handlers = unary_handlers(service, servicer, servicer.after_call)
    request_cls = message_factory.GetMessageClass(
        service.methods_by_name["ShardStream"].input_type)
    handlers["ShardStream"] = grpc.stream_stream_rpc_method_handler(
        _stream_handler(servicer), request_deserializer=_lenient_parser(request_cls),
        response_serializer=lambda m: m.SerializeToString())
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


class MasterServer:
    """The master's gRPC server: sharding service, cluster monitor, health service."""

    def __init__(self, servicer: ShardingServicer, bind: str = "127.0.0.1", port: int = 0,
                 tick_seconds: float = 0.5, monitor=None, token: str = ""):
        from antdt_tf.monitor.service import ClusterMonitorServicer
        from antdt_tf.monitor.view import ClusterView

        self.servicer = servicer
        from antdt_tf.sharding.tf_rpc import TfRpcServicer

        self.monitor = monitor if monitor is not None else ClusterMonitorServicer(ClusterView())
        self.tf_rpc = TfRpcServicer(servicer, on_step=self.monitor.view.observe_step,
                                    token=token)
        self.bind = bind
        self.requested_port = port
        self.tick_seconds = tick_seconds
        self.token = token      # the job's token: every call but health checks needs it
        self.port: Optional[int] = None
        self._server: Optional[grpc.aio.Server] = None
        self._health = health.aio.HealthServicer()
        self._ticker: Optional[asyncio.Task] = None

    @property
    def address(self) -> str:
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"{host}:{self.port}"

    async def start(self) -> int:
        from antdt_tf.auth import server_interceptors

        self._server = grpc.aio.server(options=SERVER_OPTIONS,
                                       interceptors=server_interceptors(self.token, aio=True))
        self._server.add_generic_rpc_handlers((generic_handler(self.servicer),
                                               self.monitor.generic_handler(),
                                               self.tf_rpc.generic_handler()))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        self.port = self._server.add_insecure_port(f"{host}:{self.requested_port}")
        if not self.port:
            raise OSError(f"cannot bind {host}:{self.requested_port}")
        await self._server.start()
        for name in ("", SERVICE_NAME, self.monitor.SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._ticker = asyncio.get_running_loop().create_task(self._tick_loop())
        return self.port

    async def _tick_loop(self):
        while True:
            await asyncio.sleep(self.tick_seconds)
            self.servicer.tick()
            self.monitor.view.tick()

    async def wait_for_termination(self) -> None:
        await self._server.wait_for_termination()

    async def stop(self, grace: float = 5.0) -> None:
        """Goes NOT_SERVING, drains in-flight calls for ``grace`` seconds, flushes state."""
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)
        if self._ticker is not None:
            self._ticker.cancel()
        store = self.servicer.store
        if store is not None:
            store.close(final_state=self.servicer.state.snapshot())
        self._server = None


class BackgroundMaster:
    """Runs a :class:`MasterServer` on its own event-loop thread inside this process.

    For embedding a master in a launcher, a demo or a test; a production master is the
    ``antdt-master`` process. ``with BackgroundMaster(servicer) as m: m.address``.
    """

    def __init__(self, servicer: ShardingServicer, bind: str = "127.0.0.1", port: int = 0,
                 tick_seconds: float = 0.5, monitor=None, token: str = ""):
        import threading

        self._loop = asyncio.new_event_loop()
        self.server = MasterServer(servicer, bind=bind, port=port, tick_seconds=tick_seconds,
                                   monitor=monitor, token=token)
        self._thread = threading.Thread(target=self._loop.run_forever, name="antdt-master",
                                        daemon=True)

    @property
    def address(self) -> str:
        return self.server.address

    def start(self) -> "BackgroundMaster":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(timeout=30)
        return self

    def call(self, fn: Callable, *args):
        """Runs ``fn(*args)`` on the server's loop (where the state lives) and returns it."""
        async def _run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(_run(), self._loop).result(timeout=30)

    def stop(self, grace: float = 0.0) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(grace), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
