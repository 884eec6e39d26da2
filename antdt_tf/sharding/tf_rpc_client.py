"""The worker protocol of :mod:`antdt_tf.sharding.tf_rpc` from Python.

TF2 workers make these calls with TensorFlow's RPC ops inside their ``tf.data``
pipeline. In TF1 between-graph training (``MonitoredTrainingSession``, Estimator) the
input pipeline runs in the worker's own Python process, so the same calls are made from
Python — same leases, incarnations, reports and Monitor samples as the TF2 path. No
TensorFlow here: the package works under any TF version the hooks run on.

Calls wait for the master (``wait_for_ready``) and retry while it is unreachable, up to
``unavailable_seconds``: a master restart is a pause, not an error. Master errors come
back as their :mod:`antdt_tf.errors` types.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Optional, Sequence

import grpc

from antdt_tf import auth, errors
from antdt_tf.proto import tf_rpc_pb2 as tpb
from antdt_tf.errors import MasterUnavailable
from antdt_tf.rpc import raise_typed

STATUS_SHARD, STATUS_WAIT, STATUS_END = 1, 2, 3
_CALL = "/tensorflow.rpc.RpcService/Call"


@dataclasses.dataclass(frozen=True)
class Lease:
    """One answer of ``antdt.next``: a lease of records ``[start, start + length)`` of a
    shard (record ``start`` is record ``file_start`` of ``file``), or WAIT / END."""

    status: int
    lease: int = 0
    shard: int = 0
    epoch: int = 0
    file: str = ""
    file_start: int = 0
    start: int = 0
    length: int = 0
    batch_size: int = 0     # the Controller's batch size for this worker (0: the worker's)
    sparse: int = 0         # 1: report when finished and per closure, not per batch


def report_due(sparse_reports: bool, lease_sparse: int, applied: int, length: int) -> bool:
    """Whether a trained batch's lease must be reported to the master now: every batch
    without sparse reports; with them, the lease's last batch (``applied >= length``)
    and every batch of a lease the master wants per batch (``lease_sparse == 0``: it may
    be stolen or backed up). The rule of every trainer that reports per step — the TF1
    hooks here, :func:`antdt_tf.tf.accounting.report_due_tensor` (its graph twin, checked to
    agree) in ``PullTrainer`` and the Keras step."""
    return not sparse_reports or lease_sparse == 0 or applied >= length


def _i64(v: int) -> tpb.TfTensor:
    return tpb.TfTensor(dtype=tpb.DT_INT64, int64_val=[int(v)])


def _str(v: str) -> tpb.TfTensor:
    return tpb.TfTensor(dtype=tpb.DT_STRING, string_val=[v.encode()])


def _vec(values: Sequence[int], dtype: int) -> tpb.TfTensor:
    t = tpb.TfTensor(dtype=dtype, tensor_shape=tpb.TfTensorShape(
        dim=[tpb.TfTensorShape.Dim(size=len(values))]))
    (t.int64_val if dtype == tpb.DT_INT64 else t.int_val).extend(int(v) for v in values)
    return t


def _out(t: tpb.TfTensor):
    if t.dtype == tpb.DT_STRING:
        return t.string_val[0].decode() if t.string_val else ""
    vals = t.int64_val if t.dtype == tpb.DT_INT64 else t.int_val
    return int(vals[0]) if vals else 0


class TfRpcClient:
    """``antdt.open`` / ``next`` / ``report`` / ``step`` for one worker of one dataset."""

    def __init__(self, address: str, dataset: str, worker: int, timeout: float = 30.0,
                 unavailable_seconds: float = 120.0):
        if worker < 0:
            raise ValueError(f"worker index must be >= 0, got {worker}")
        self.address, self.dataset, self.worker = address, dataset, worker
        self.timeout, self.unavailable_seconds = timeout, unavailable_seconds
        self._channel = auth.channel(address)
        self._call_rpc = self._channel.unary_unary(
            _CALL, request_serializer=tpb.TfCallRequest.SerializeToString,
            response_deserializer=tpb.TfCallResponse.FromString)
        self.incarnation = 0
        self._requests = itertools.count(1)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method: str, args: list, timeout: Optional[float] = None) -> list:
        token = auth.job_token()
        req = tpb.TfCallRequest(method=method,
                                input_tensors=list(args) + ([_str(token)] if token else []))
        give_up = time.monotonic() + self.unavailable_seconds
        delay = 0.1
        while True:
            try:
                resp = self._call_rpc(req, timeout=timeout or self.timeout, wait_for_ready=True)
                return [_out(t) for t in resp.output_tensors]
            except grpc.RpcError as e:
                try:
                    raise_typed(e, method)
                except MasterUnavailable:
                    if time.monotonic() >= give_up:
                        raise
                time.sleep(delay)
                delay = min(2.0, delay * 2)

    def open(self) -> int:
        """A new incarnation of this worker (the old one's leases go back to TODO from
        their reported offsets when this one first asks for a lease)."""
        (self.incarnation,) = self._call("antdt.open", [_str(self.dataset), _i64(self.worker)])
        self._requests = itertools.count(1)
        return self.incarnation

    def _who(self) -> list:
        if not self.incarnation:
            raise errors.InvalidRequest("call open() before asking for leases")
        return [_str(self.dataset), _i64(self.worker), _i64(self.incarnation)]

    def next(self, wait_ms: int = -1) -> Lease:
        """The next lease; long-polls up to the master's 2 s (or ``wait_ms``) while every
        remaining shard is leased elsewhere (then ``status == STATUS_WAIT``). A retry
        after a lost answer returns the same lease (same request id)."""
        args = self._who() + [_i64(next(self._requests))]
        if wait_ms >= 0:
            args.append(_i64(wait_ms))
        return Lease(*self._call("antdt.next", args, timeout=self.timeout + 3.0))

    def report(self, leases: Sequence[int], shards: Sequence[int], epochs: Sequence[int],
               applied: Sequence[int], seconds: Optional[float] = None,
               steps: int = 1) -> int:
        """``applied[i]`` records of ``leases[i]`` are trained; returns how many of the
        leases the master refused (no longer this worker's: skip their other batches).
        ``seconds``: this worker's own time in the ``steps`` steps since its previous
        report (the Monitor's BPT; without it the master times the gap, one step)."""
        args = self._who() + [_vec(leases, tpb.DT_INT64), _vec(shards, tpb.DT_INT64),
                              _vec(epochs, tpb.DT_INT32), _vec(applied, tpb.DT_INT64)]
        if seconds is not None:
            args += [_i64(int(seconds * 1e6)), _i64(max(1, steps))]
        (rejected,) = self._call("antdt.report", args)
        return rejected

    def step(self, records: int, seconds: float) -> None:
        """A step time measured on this worker, for the Monitor only (nothing counted)."""
        self._call("antdt.step", self._who() + [_i64(records), _i64(int(seconds * 1e6))])
