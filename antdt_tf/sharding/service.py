"""The gRPC face of the sharding service: a thin servicer over :class:`ShardState`.

Handlers validate, call the core, persist through the store; domain errors become
status codes in one place (``antdt_tf.rpc``). The master's server composes this
service with the others (``antdt_tf.master.server``).

The server is ``grpc.aio``: one event loop owns the state, so no lock is needed and the
journal is written in the same order the events are applied.
"""

from __future__ import annotations

import logging
from typing import Optional

import grpc
from google.protobuf import message_factory

from antdt_tf import limits
from antdt_tf.errors import AntdtError, InvalidRequest, bounded, shown
from antdt_tf.rpc import Malformed, lenient_parser, status_of, unary_handlers
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.state import ShardState, spec_from_proto
from antdt_tf.sharding.store import StateStore

log = logging.getLogger(__name__)

SERVICE_NAME = "antdt.v1.ShardingService"


class ShardingServicer:
    """Implements antdt.v1.ShardingService over a ShardState (and its store)."""

    # ADJUST_BS never asks a worker for more than this many records in one batch
    MAX_BATCH_SIZE = limits.MAX_BATCH_SIZE

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
            log.warning("task %s:%d#%d reported dead (%s): %d lease(s) released (back to "
                        "TODO; sparse ones held for their trainer to settle)",
                        req.task.type, req.task.index, req.task.incarnation,
                        shown(req.reason) if req.reason else "no reason given", released)
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

    def KeepHeldLeases(self, req: pb.KeepHeldLeasesRequest) -> pb.KeepHeldLeasesResponse:
        return pb.KeepHeldLeasesResponse(held=self.state.keep_held(req.dataset))

    def SetBatchSizes(self, req: pb.SetBatchSizesRequest) -> pb.SetBatchSizesResponse:
        self.state.lease_length(req.dataset, -1)      # raises UnknownDataset
        for worker, size in req.batch_sizes.items():
            if not 0 <= worker <= limits.MAX_TASK_INDEX:
                raise InvalidRequest(f"worker index must be in [0, {limits.MAX_TASK_INDEX}], "
                                     f"got {worker}")
            if not 0 < size <= self.MAX_BATCH_SIZE:
                raise InvalidRequest(f"batch size of worker {worker} must be in "
                                     f"[1, {self.MAX_BATCH_SIZE}], got {size}")
        sizes = {} if req.replace else dict(self.batch_sizes.get(req.dataset, {}))
        sizes.update(req.batch_sizes)
        if len(sizes) > limits.MAX_TASKS:
            raise InvalidRequest(f"batch sizes for {len(sizes)} workers, at most "
                                 f"{limits.MAX_TASKS} allowed")
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
        if isinstance(request, Malformed):
            return pb.ShardStreamResponse(error=pb.CallError(
                code=grpc.StatusCode.INVALID_ARGUMENT.value[0], type="InvalidRequest",
                message=bounded(f"malformed request: {request.error}")))
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
                code=status_of(e).value[0], type=type(e).__name__, message=bounded(str(e))))
        except Exception:  # noqa: BLE001 (a bug: answered, logged; the stream stays up)
            log.exception("ShardStream call failed unexpectedly")
            return pb.ShardStreamResponse(seq=request.seq, error=pb.CallError(
                code=grpc.StatusCode.INTERNAL.value[0], type="InternalError",
                message="internal error in the master (see its log)"))

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


def generic_handler(servicer: ShardingServicer) -> grpc.GenericRpcHandler:
    service = pb.DESCRIPTOR.services_by_name["ShardingService"]
    handlers = unary_handlers(service, servicer, servicer.after_call)
    request_cls = message_factory.GetMessageClass(
        service.methods_by_name["ShardStream"].input_type)
    handlers["ShardStream"] = grpc.stream_stream_rpc_method_handler(
        _stream_handler(servicer), request_deserializer=lenient_parser(request_cls),
        response_serializer=lambda m: m.SerializeToString())
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)
