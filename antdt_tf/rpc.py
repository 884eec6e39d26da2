"""gRPC plumbing every antdt service shares: domain errors mapped to status codes in one
place (``ERROR_CODES``), the error's class name in the ``antdt-error`` trailing metadata
(clients re-raise the same type), lenient parsing (bytes that do not parse are answered
INVALID_ARGUMENT, not gRPC's INTERNAL), and the server options."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Callable, Optional

import grpc
from google.protobuf import message_factory
from google.protobuf.message import DecodeError

from antdt_tf import errors
from antdt_tf.errors import (ERROR_METADATA_KEY, AntdtError, DatasetConflict, bounded,
                             IncompatibleState, InvalidRequest, JobConflict, LeaseNotHeld,
                             MasterUnavailable, RpcFailed, StaleGeneration,
                             StaleIncarnation, TaskAlreadyRunning, UnknownDataset, UnknownTask)

log = logging.getLogger(__name__)

ERROR_CODES: dict[type, grpc.StatusCode] = {
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownDataset: grpc.StatusCode.NOT_FOUND,
    UnknownTask: grpc.StatusCode.NOT_FOUND,
    DatasetConflict: grpc.StatusCode.ALREADY_EXISTS,
    JobConflict: grpc.StatusCode.ALREADY_EXISTS,
    StaleIncarnation: grpc.StatusCode.FAILED_PRECONDITION,
    LeaseNotHeld: grpc.StatusCode.FAILED_PRECONDITION,
    IncompatibleState: grpc.StatusCode.FAILED_PRECONDITION,
    TaskAlreadyRunning: grpc.StatusCode.FAILED_PRECONDITION,
    StaleGeneration: grpc.StatusCode.FAILED_PRECONDITION,
}


def raise_typed(e: grpc.RpcError, what: str, unavailable=None):
    """The client side of the error mapping: re-raises a failed call as the antdt-tf
    error the service raised (named in the trailing metadata); an unreachable peer as
    ``unavailable`` (default :class:`MasterUnavailable`); anything else as
    :class:`RpcFailed`. ``what`` names the call in the message."""
    name = dict(e.trailing_metadata() or ()).get(ERROR_METADATA_KEY)
    cls = getattr(errors, name, None) if name else None
    if isinstance(cls, type) and issubclass(cls, AntdtError):
        raise cls(e.details()) from e
    if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        cls = unavailable or MasterUnavailable
        peer = "master" if cls is MasterUnavailable else "peer"
        raise cls(f"{what}: {peer} unreachable ({e.code().name}: {e.details()})") from e
    raise RpcFailed(f"{what}: {e.code().name}: {e.details()}") from e


# so_reuseport=0: a second master on the same port fails instead of sharing it.
SERVER_OPTIONS = [("grpc.so_reuseport", 0), ("grpc.http2.bdp_probe", 0),
                  ("grpc.enable_channelz", 0)]


class Malformed:
    """Stands in for a request whose bytes did not parse."""

    def __init__(self, error: str):
        self.error = error


def lenient_parser(cls):
    def parse(data: bytes):
        msg = cls()
        try:
            msg.ParseFromString(data)
        except DecodeError as e:
            return Malformed(f"{e}")
        return msg
    return parse



def status_of(error: AntdtError) -> grpc.StatusCode:
    return next((c for t, c in ERROR_CODES.items() if isinstance(error, t)),
                grpc.StatusCode.INTERNAL)


def aio_handler(fn: Callable, after: Callable[[], None]):
    async def handle(request, context: grpc.aio.ServicerContext):
        if isinstance(request, Malformed):
            context.set_trailing_metadata(((ERROR_METADATA_KEY, "InvalidRequest"),))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                bounded(f"malformed request: {request.error}"))
        try:
            response = fn(request)
        except AntdtError as e:
            context.set_trailing_metadata(((ERROR_METADATA_KEY, type(e).__name__),))
            await context.abort(status_of(e), bounded(str(e)))
        except Exception:  # noqa: BLE001 (a bug: never a traceback or the input to the caller)
            log.exception("%s failed unexpectedly", getattr(fn, "__name__", fn))
            await context.abort(grpc.StatusCode.INTERNAL,
                                "internal error in the master (see its log)")
        after()
        return response
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
            aio_handler(getattr(servicer, method.name), after),
            request_deserializer=lenient_parser(request_cls),
            response_serializer=lambda m: m.SerializeToString())
    return handlers


class LoopStub:
    """A servicer with a gRPC stub's face, for a caller in the servicer's own process: each
    call runs on the event loop that owns the servicer's state (so it needs no lock, as a
    gRPC call does not), with the same after-call work, and its domain errors reach the
    caller as they are. The master's job runner, a thread of the master, calls the
    master's services this way: no channel, no serialization, no token."""

    def __init__(self, servicer, loop, after: Callable[[], None] = lambda: None):
        self._servicer, self._loop, self._after = servicer, loop, after

    def __getattr__(self, method: str):
        fn = getattr(self._servicer, method)

        def call(request, timeout: Optional[float] = None, wait_for_ready=None):
            async def run():
                response = fn(request)
                self._after()
                return response
            future = asyncio.run_coroutine_threadsafe(run(), self._loop)
            try:
                return future.result(timeout)
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise TimeoutError(f"{method}: the master's event loop did not answer "
                                   f"within {timeout} s") from None
        return call
