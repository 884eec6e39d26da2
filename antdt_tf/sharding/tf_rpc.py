"""The master answers TensorFlow's RPC ops, so a worker's tf.data pipeline pulls shards.

TensorFlow's experimental RPC ops (``tf.distribute.experimental.rpc``: ``RpcClient``,
``RpcCall``, ...) speak gRPC service ``tensorflow.rpc.RpcService`` (``Call`` = method
name + tensors in, tensors out). The master serves that path itself, with the wire
messages mirrored in ``protos/antdt/v1/tf_rpc.proto`` — no TensorFlow in the master,
no bridge process. Each worker's input pipeline (``antdt_tf.tf.pull``) calls:

``antdt.open(dataset: string, worker[, sparse]: int64) -> incarnation: int64``
    A new incarnation of task ``worker:<i>`` for a new per-worker iterator (e.g. after
    the worker restarted). It replaces the old incarnation at once: its leases go back
    to TODO from their reported offsets (sparse ones are held for the trainer to
    settle). ``sparse`` = 1: this incarnation's trainer records every batch's offset
    on the PS and settles leases from there (``ApplyLeaseRecord``), so its leases may
    have sparse reports (below). An incarnation differs from the worker's previous
    one in parity (the trainer keeps two records per worker slot, by parity, so a new
    incarnation does not overwrite the record of the one that died before it was
    settled).
``antdt.next(dataset, worker, incarnation, request[, wait_ms]: int64) -> (status: int32, lease,
shard: int64, epoch: int32, file: string, file_start, start, length, batch_size,
sparse: int64)``
    The next lease. ``request`` (> 0, unique per incarnation) makes a retried call
    return the same lease instead of a second one. Long-polls up to ``wait_seconds``
    (or ``wait_ms``, if smaller: BSP rounds do not wait) while every remaining shard is
    leased elsewhere (status 2 = WAIT: ask again);
    1 = SHARD; 3 = END. ``batch_size``: the Controller's records per batch for this
    worker (ADJUST_BS), 0 = the worker's own. ``sparse`` = 1: report this lease when it
    is finished and at the end of each closure, not after every batch (0: after every
    batch: the master may steal or back up its rest, for which it must know where the
    holder is).
``antdt.report(dataset, worker, incarnation, leases: int64[], shards: int64[],
epochs: int32[], applied: int64[][, micros, steps: int64]) -> rejected: int64``
    After a training step (or, sparse, several): ``applied[i]`` records of ``leases[i]`` (from its start) are
    trained. A lease whose records are all applied becomes DONE, otherwise PROGRESS (so
    a re-issue resumes after them). Reports the master cannot accept (the lease was
    re-issued after an expiry or a restore, or the incarnation was replaced) are
    counted in ``rejected`` and change nothing; the step itself is not failed for them.
    ``micros``: the worker's own time in the ``steps`` steps since its previous report
    (the Monitor's BPT; without it, the time between reports, one step).

``antdt.step(dataset, worker, incarnation, records, micros: int64) -> 0: int64``
    BSP mode: a worker computed a gradient over ``records`` in ``micros`` of its own
    time. Only the Monitor hears it (a BSP step is applied, and reported, by the chief
    after the round): step times measured on the worker, not arrival times that the
    round barrier makes equal.

Errors (bad arguments, unknown dataset, a stale incarnation) are gRPC statuses, which
the RPC ops raise as the matching ``tf.errors`` type on the worker.
"""

from __future__ import annotations

import array
import asyncio
import hmac
import logging
import time

import grpc

from antdt_tf import limits
from antdt_tf.errors import (ERROR_METADATA_KEY, AntdtError, InvalidRequest, LeaseNotHeld,
                             StaleIncarnation, bounded, shown)
from antdt_tf.rpc import status_of
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.proto import tf_rpc_pb2 as tpb

log = logging.getLogger(__name__)

SERVICE_NAME = "tensorflow.rpc.RpcService"
STATUS_SHARD, STATUS_WAIT, STATUS_END = 1, 2, 3
WORKER_TASK = "worker"


def _scalar(t: tpb.TfTensor, dtype: int, what: str):
    if t.dtype != dtype or len(t.tensor_shape.dim) != 0:
        raise InvalidRequest(f"{what} must be a scalar of type {tpb.TfDataType.Name(dtype)}, "
                             f"got {tpb.TfDataType.Name(t.dtype)} with shape "
                             f"{[d.size for d in t.tensor_shape.dim]}")
    if dtype == tpb.DT_STRING:
        try:
            return t.string_val[0].decode() if t.string_val else ""
        except UnicodeDecodeError:
            raise InvalidRequest(f"{what} must be UTF-8 text") from None
    return _values(t, dtype, what)[0] if (t.int64_val or t.int_val or t.tensor_content) else 0


def _values(t: tpb.TfTensor, dtype: int, what: str) -> list[int]:
    if t.tensor_content:
        a = array.array("q" if dtype == tpb.DT_INT64 else "i")
        if len(t.tensor_content) % a.itemsize:
            raise InvalidRequest(f"{what}: tensor_content of {len(t.tensor_content)} bytes is "
                                 f"not a whole number of {a.itemsize}-byte values")
        if len(t.tensor_content) // a.itemsize > limits.MAX_REPORT_LEASES:
            raise InvalidRequest(f"{what}: more than {limits.MAX_REPORT_LEASES} values")
        a.frombytes(t.tensor_content)
        return a.tolist()
    values = t.int64_val if dtype == tpb.DT_INT64 else t.int_val
    if len(values) > limits.MAX_REPORT_LEASES:
        raise InvalidRequest(f"{what}: more than {limits.MAX_REPORT_LEASES} values")
    return list(values)


def _vector(t: tpb.TfTensor, dtype: int, what: str) -> list[int]:
    if t.dtype != dtype or len(t.tensor_shape.dim) != 1:
        raise InvalidRequest(f"{what} must be a vector of type {tpb.TfDataType.Name(dtype)}")
    n = t.tensor_shape.dim[0].size
    if not 0 <= n <= limits.MAX_REPORT_LEASES:
        raise InvalidRequest(f"{what}: shape [{n}] out of range [0, {limits.MAX_REPORT_LEASES}]")
    values = _values(t, dtype, what)
    if len(values) != n:
        if len(values) == 1:       # TF writes a run of equal values once
            values = values * n
        else:
            raise InvalidRequest(f"{what}: {len(values)} values for shape [{n}]")
    return values


def _check_worker(worker: int) -> None:
    if not 0 <= worker <= limits.MAX_TASK_INDEX:
        raise InvalidRequest(f"worker index must be in [0, {limits.MAX_TASK_INDEX}], "
                             f"got {worker}")


def _i64(v: int) -> tpb.TfTensor:
    return tpb.TfTensor(dtype=tpb.DT_INT64, int64_val=[v])


def _i32(v: int) -> tpb.TfTensor:
    return tpb.TfTensor(dtype=tpb.DT_INT32, int_val=[v])


def _str(v: str) -> tpb.TfTensor:
    return tpb.TfTensor(dtype=tpb.DT_STRING, string_val=[v.encode()])


class TfRpcServicer:
    """``tensorflow.rpc.RpcService`` over the master's ShardingServicer (same state,
    same event loop, same journal)."""

    def __init__(self, sharding, wait_seconds: float = 2.0, poll_seconds: float = 0.05,
                 on_step=None, token: str = ""):
        self.sharding = sharding
        # TF's RPC ops send no metadata: with a job token every call carries it as its
        # last argument (a string tensor), checked and removed here before dispatch
        self.token = token
        # on_step(worker, incarnation, records, seconds=None): every trained batch, for
        # the Monitor's BPT (seconds: measured by the worker; None: since its last step)
        self.on_step = on_step
        self.wait_seconds = wait_seconds
        self.poll_seconds = poll_seconds
        # (dataset, worker, incarnation) opened with sparse = 1. Soft state: after a
        # master restart their leases are reported per batch (always safe).
        self._sparse: set[tuple[str, int, int]] = set()

    @property
    def state(self):
        return self.sharding.state

    def _args(self, req: tpb.TfCallRequest, n: int):
        if len(req.input_tensors) != n:
            raise InvalidRequest(f"{req.method} takes {n} arguments, got {len(req.input_tensors)}")
        return req.input_tensors

    def _task(self, worker: int, incarnation: int) -> pb.TaskId:
        _check_worker(worker)
        if not 0 <= incarnation <= limits.MAX_INCARNATION:
            raise InvalidRequest(f"incarnation must be in [0, {limits.MAX_INCARNATION}], "
                                 f"got {incarnation}")
        return pb.TaskId(type=WORKER_TASK, index=worker, incarnation=incarnation)

    def open(self, req) -> tpb.TfCallResponse:
        sparse = 0
        if len(req.input_tensors) == 3:
            sparse = _scalar(req.input_tensors[2], tpb.DT_INT64, "sparse")
            if sparse not in (0, 1):
                raise InvalidRequest(f"sparse must be 0 or 1, got {sparse}")
            req = tpb.TfCallRequest(method=req.method, input_tensors=req.input_tensors[:2])
        dataset_t, worker_t = self._args(req, 2)
        dataset = _scalar(dataset_t, tpb.DT_STRING, "dataset")
        worker = _scalar(worker_t, tpb.DT_INT64, "worker")
        self.state.progress(dataset)          # UnknownDataset if not registered
        _check_worker(worker)
        previous = self.state.task_incarnation(WORKER_TASK, worker)
        incarnation = max(previous + 1, int(time.time() * 1000))
        if previous >= 0 and (incarnation - previous) % 2 == 0:
            incarnation += 1   # the other parity than the previous one (see the docstring)
        if sparse:
            self._sparse.add((dataset, worker, incarnation))
        self.state.join_task(self._task(worker, incarnation))   # the old one's leases: released
        self.sharding.after_call()
        log.info("worker %d opened dataset %s as incarnation %d", worker, dataset, incarnation)
        return tpb.TfCallResponse(output_tensors=[_i64(incarnation)])

    async def next(self, req) -> tpb.TfCallResponse:
        wait_seconds = self.wait_seconds
        if len(req.input_tensors) == 5:      # an explicit long-poll bound (ms)
            wait_ms = _scalar(req.input_tensors[4], tpb.DT_INT64, "wait_ms")
            if wait_ms < 0:
                raise InvalidRequest(f"wait_ms must be >= 0, got {wait_ms}")
            wait_seconds = min(wait_seconds, wait_ms / 1000)
            req = tpb.TfCallRequest(method=req.method, input_tensors=req.input_tensors[:4])
        dataset_t, worker_t, inc_t, request_t = self._args(req, 4)
        dataset = _scalar(dataset_t, tpb.DT_STRING, "dataset")
        task = self._task(_scalar(worker_t, tpb.DT_INT64, "worker"),
                          _scalar(inc_t, tpb.DT_INT64, "incarnation"))
        request_id = _scalar(request_t, tpb.DT_INT64, "request")
        if request_id <= 0:
            raise InvalidRequest(f"request must be > 0, got {request_id}")
        deadline = time.monotonic() + wait_seconds
        while True:
            if dataset in self.sharding.paused:
                resp = self.sharding.paused_answer(dataset)
            else:
                resp = self.state.get_shard(dataset, task, request_id,
                                            (dataset, task.index, task.incarnation)
                                            in self._sparse)
            self.sharding.after_call()
            if resp.status != pb.GetShardResponse.WAIT or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(self.poll_seconds, max(0.0, deadline - time.monotonic())))
        s = resp.shard
        status = {pb.GetShardResponse.SHARD: STATUS_SHARD, pb.GetShardResponse.WAIT: STATUS_WAIT,
                  pb.GetShardResponse.END: STATUS_END}[resp.status]
        return tpb.TfCallResponse(output_tensors=[
            _i32(status), _i64(s.lease_id), _i64(s.shard_id), _i32(s.epoch), _str(s.file),
            _i64(s.file_start), _i64(s.start), _i64(s.length),
            _i64(self.sharding.batch_size_of(dataset, task.index)), _i64(int(s.sparse_reports))])

    def report(self, req) -> tpb.TfCallResponse:
        seconds, steps = None, 1
        if len(req.input_tensors) in (8, 9):
            micros = _scalar(req.input_tensors[7], tpb.DT_INT64, "micros")
            if len(req.input_tensors) == 9:
                steps = _scalar(req.input_tensors[8], tpb.DT_INT64, "steps")
            if micros < 0 or steps < 1:
                raise InvalidRequest(f"micros must be >= 0 and steps >= 1, got {micros}, {steps}")
            seconds = micros / 1e6
            req = tpb.TfCallRequest(method=req.method, input_tensors=req.input_tensors[:7])
        dataset_t, worker_t, inc_t, leases_t, shards_t, epochs_t, applied_t = self._args(req, 7)
        dataset = _scalar(dataset_t, tpb.DT_STRING, "dataset")
        task = self._task(_scalar(worker_t, tpb.DT_INT64, "worker"),
                          _scalar(inc_t, tpb.DT_INT64, "incarnation"))
        leases = _vector(leases_t, tpb.DT_INT64, "leases")
        shards = _vector(shards_t, tpb.DT_INT64, "shards")
        epochs = _vector(epochs_t, tpb.DT_INT32, "epochs")
        applied = _vector(applied_t, tpb.DT_INT64, "applied")
        if not len(leases) == len(shards) == len(epochs) == len(applied):
            raise InvalidRequest("leases, shards, epochs and applied must have equal lengths")
        if len(set(leases)) != len(leases):
            raise InvalidRequest("leases: a lease is listed twice")
        reports = []
        for lease, shard, epoch, n in zip(leases, shards, epochs, applied):
            length = self.state.lease_length(dataset, lease)
            # not active: a retried DONE answers DUPLICATE, anything else is rejected
            outcome = (pb.ReportShardRequest.DONE if length is None or n == length
                       else pb.ReportShardRequest.PROGRESS)
            report = pb.ReportShardRequest(dataset=dataset, task=task, lease_id=lease,
                                           shard_id=shard, epoch=epoch, outcome=outcome,
                                           records_processed=n)
            try:
                self.state.precheck_report(report)   # a bad one refuses the whole call
            except (LeaseNotHeld, StaleIncarnation):
                pass                                 # counted as rejected below
            reports.append(report)
        rejected = 0
        before = self.state.task_records(task.type, task.index)
        for report in reports:
            try:
                self.state.report_shard(report)
            except (LeaseNotHeld, StaleIncarnation) as e:
                rejected += 1   # the worker skips the rest of this lease's batches
                log.warning("report from %s:%d#%d not counted: %s", task.type, task.index,
                            task.incarnation, e)
        self.sharding.after_call()
        if self.on_step is not None and rejected < len(leases):
            self.on_step(task.index, task.incarnation,
                         self.state.task_records(task.type, task.index) - before, seconds, steps)
        return tpb.TfCallResponse(output_tensors=[_i64(rejected)])

    def step(self, req) -> tpb.TfCallResponse:
        dataset_t, worker_t, inc_t, records_t, micros_t = self._args(req, 5)
        self.state.progress(_scalar(dataset_t, tpb.DT_STRING, "dataset"))  # UnknownDataset
        worker = _scalar(worker_t, tpb.DT_INT64, "worker")
        incarnation = _scalar(inc_t, tpb.DT_INT64, "incarnation")
        records = _scalar(records_t, tpb.DT_INT64, "records")
        micros = _scalar(micros_t, tpb.DT_INT64, "micros")
        _check_worker(worker)
        if records < 0 or micros < 0 or incarnation < 0:
            raise InvalidRequest(f"incarnation, records and micros must be >= 0, got "
                                 f"{incarnation}, {records}, {micros}")
        if self.state.task_incarnation(WORKER_TASK, worker) > incarnation:
            raise StaleIncarnation(f"worker {worker} incarnation {incarnation} was replaced")
        if self.on_step is not None and records > 0:
            self.on_step(worker, incarnation, records, micros / 1e6)
        return tpb.TfCallResponse(output_tensors=[_i64(0)])

    METHODS = {"antdt.open": "open", "antdt.next": "next", "antdt.report": "report",
               "antdt.step": "step"}

    async def Call(self, raw: bytes, context: grpc.aio.ServicerContext):
        req = tpb.TfCallRequest()
        try:
            req.ParseFromString(raw)
        except Exception as e:  # DecodeError: bytes that are not a CallRequest
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                bounded(f"malformed CallRequest: {e}"))
        if self.token:
            last = req.input_tensors[-1] if req.input_tensors else None
            got = (last.string_val[0] if last is not None and last.dtype == tpb.DT_STRING
                   and len(last.string_val) == 1 else b"")
            if not hmac.compare_digest(got, self.token.encode()):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                    f"{shown(req.method)}: missing or wrong job token (the "
                                    "last argument of every call when the master has a token)")
            del req.input_tensors[-1]
        name = self.METHODS.get(req.method)
        if name is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"method {shown(req.method)} is not served; known: "
                                f"{sorted(self.METHODS)}")
        try:
            result = getattr(self, name)(req)
            if asyncio.iscoroutine(result):
                result = await result
            return result
        except AntdtError as e:
            # the error's type for Python clients (TfRpcClient); TF's ops see the status
            context.set_trailing_metadata(((ERROR_METADATA_KEY, type(e).__name__),))
            await context.abort(status_of(e), bounded(f"{req.method}: {e}"))
        except Exception:  # noqa: BLE001 (a bug: never a traceback or the input to the caller)
            log.exception("%s failed unexpectedly", req.method)
            await context.abort(grpc.StatusCode.INTERNAL,
                                "internal error in the master (see its log)")

    async def List(self, raw: bytes, context) -> tpb.TfListResponse:
        return tpb.TfListResponse(registered_methods=[
            tpb.TfRegisteredMethod(method=m) for m in sorted(self.METHODS)])

    def generic_handler(self) -> grpc.GenericRpcHandler:
        ser = lambda m: m.SerializeToString()  # noqa: E731
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Call": grpc.unary_unary_rpc_method_handler(self.Call, response_serializer=ser),
            "List": grpc.unary_unary_rpc_method_handler(self.List, response_serializer=ser),
        })
