"""ShardingClient: what a trainer (or the launcher following a job, or the master's own
job runner, in process) uses to talk to the master's sharding service.

Every call carries a deadline; calls wait for the master to be reachable
(``wait_for_ready``) and gRPC retries UNAVAILABLE for them, so a master restart
looks like a slow call, not an error. Retries are safe: GetShard carries a request id
(a retried GetShard returns the same lease) and a repeated DONE answers DUPLICATE.

Errors come back as the same :mod:`antdt_tf.errors` types the master raised (carried in
the ``antdt-error`` trailing metadata); transport failures raise :class:`MasterUnavailable`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import random
import threading
import time
from typing import Iterator, Optional, Sequence, Union

import grpc

from antdt_tf import auth, errors
from antdt_tf.errors import MasterUnavailable, RpcFailed  # noqa: F401 (part of this API)
from antdt_tf.rpc import raise_typed
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.proto import sharding_pb2_grpc as pb_grpc
from antdt_tf.sharding.plan import DatasetSpec
from antdt_tf.sharding.state import spec_to_proto

log = logging.getLogger(__name__)

_SERVICE_CONFIG = json.dumps({
    "methodConfig": [{
        "name": [{"service": "antdt.v1.ShardingService"}],
        "retryPolicy": {
            "maxAttempts": 5,
            "initialBackoff": "0.1s",
            "maxBackoff": "2s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }]
})


@dataclasses.dataclass(frozen=True)
class Task:
    """Who is asking: a task of the job and its incarnation."""

    type: str
    index: int
    incarnation: int = 0

    def proto(self) -> pb.TaskId:
        return pb.TaskId(type=self.type, index=self.index, incarnation=self.incarnation)

    def __str__(self):
        return f"{self.type}:{self.index}#{self.incarnation}"


class ShardingClient:
    """A typed client of one master. Thread-safe (gRPC channels are)."""

    def __init__(self, address: str, task: Optional[Task] = None, timeout: float = 30.0,
                 channel: Optional[grpc.Channel] = None, stub=None):
        """``stub``: the master's servicer in this process (``rpc.LoopStub``) instead of a
        channel to ``address``."""
        self.address = address
        self.task = task
        self.timeout = timeout
        self._channel = None if stub is not None else channel or auth.channel(
            address, options=[("grpc.service_config", _SERVICE_CONFIG),
                              ("grpc.enable_retries", 1)])
        self._stub = stub if stub is not None else pb_grpc.ShardingServiceStub(self._channel)
        self._request_base = random.getrandbits(40) << 20
        self._request_seq = 0

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method: str, request, timeout: Optional[float] = None):
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout,
                                               wait_for_ready=True)
        except grpc.RpcError as e:
            raise_typed(e, method)

    def _next_request_id(self) -> int:
        self._request_seq += 1
        return self._request_base + self._request_seq

    def _task(self, task: Optional[Task]) -> pb.TaskId:
        task = task or self.task
        if task is None:
            raise ValueError("this client has no task; pass task=Task(type, index, incarnation)")
        return task.proto()

    # ----------------------------------------------------------------- calls

    def register_dataset(self, spec: Union[DatasetSpec, pb.DatasetSpec]) -> pb.RegisterDatasetResponse:
        msg = spec if isinstance(spec, pb.DatasetSpec) else spec_to_proto(spec)
        return self._call("RegisterDataset", pb.RegisterDatasetRequest(spec=msg))

    def _get_request(self, dataset: str, task: Optional[Task]) -> pb.GetShardRequest:
        return pb.GetShardRequest(dataset=dataset, task=self._task(task),
                                  request_id=self._next_request_id())

    def _report_request(self, shard: pb.Shard, outcome, records: int, task: Optional[Task],
                        get_next: bool = False, error: str = "") -> pb.ReportShardRequest:
        return pb.ReportShardRequest(
            dataset=shard.dataset, task=self._task(task), lease_id=shard.lease_id,
            shard_id=shard.shard_id, epoch=shard.epoch, outcome=outcome,
            records_processed=records, error_message=error, get_next=get_next,
            next_request_id=self._next_request_id() if get_next else 0)

    def get_shard(self, dataset: str, task: Optional[Task] = None) -> pb.GetShardResponse:
        return self._call("GetShard", self._get_request(dataset, task))

    def _report(self, shard: pb.Shard, outcome, records: int, task: Optional[Task],
                get_next: bool = False, error: str = "") -> pb.ReportShardResponse:
        return self._call("ReportShard",
                          self._report_request(shard, outcome, records, task, get_next, error))

    def stream(self, task: Optional[Task] = None) -> "ShardStream":
        """A long-lived session for pulling many shards cheaply (see :class:`ShardStream`)."""
        return ShardStream(self, task)

    def report_done(self, shard: pb.Shard, task: Optional[Task] = None,
                    get_next: bool = False) -> pb.ReportShardResponse:
        """All of the shard's records were trained. With ``get_next`` the response's
        ``next`` is the following GetShard answer (one round trip instead of two)."""
        return self._report(shard, pb.ReportShardRequest.DONE, shard.length, task, get_next)

    def report_progress(self, shard: pb.Shard, records: int,
                        task: Optional[Task] = None) -> pb.ReportShardResponse:
        """``records`` of the shard are trained so far; renews the lease."""
        return self._report(shard, pb.ReportShardRequest.PROGRESS, records, task)

    def report_failed(self, shard: pb.Shard, records: int = 0, error: str = "",
                      task: Optional[Task] = None) -> pb.ReportShardResponse:
        """Gives the shard back; the first ``records`` of it were trained."""
        return self._report(shard, pb.ReportShardRequest.FAILED, records, task, error=error)

    def report_task_failure(self, task: Task, reason: str = "") -> int:
        return self._call("ReportTaskFailure", pb.ReportTaskFailureRequest(
            task=task.proto(), reason=reason)).released_shards

    def apply_lease_record(self, dataset: str, lease_id: int, holder: pb.TaskId,
                           records_applied: int) -> bool:
        """How far a lease with sparse reports got, from its holder's record on the PS
        (-1: none recorded): settles a held lease (``DatasetProgress.held``), counts a
        live one up to there. False: the lease is not that holder's any more."""
        return self._call("ApplyLeaseRecord", pb.LeaseRecord(
            dataset=dataset, lease_id=lease_id, holder=holder,
            records_applied=records_applied)).applied

    def keep_held_leases(self, dataset: str) -> int:
        """The trainer that settles ``dataset``'s held leases is alive: the master
        restarts their settle timeout. Returns how many leases are held now."""
        return self._call("KeepHeldLeases", pb.KeepHeldLeasesRequest(dataset=dataset)).held

    def progress(self, dataset: str = "") -> pb.GetProgressResponse:
        return self._call("GetProgress", pb.GetProgressRequest(dataset=dataset))

    def set_batch_sizes(self, dataset: str, sizes: dict[int, int],
                        replace: bool = False) -> dict[int, int]:
        """ADJUST_BS: records per batch by worker index, in force from each worker's next
        lease. ``replace``: workers not in ``sizes`` go back to their default. Returns
        the sizes now in force."""
        return dict(self._call("SetBatchSizes", pb.SetBatchSizesRequest(
            dataset=dataset, batch_sizes=sizes, replace=replace)).batch_sizes)

    def set_paused(self, dataset: str, paused: bool) -> bool:
        """Holds (``paused``) or resumes a dataset: while held no new lease is issued."""
        return self._call("SetPaused", pb.SetPausedRequest(dataset=dataset,
                                                           paused=paused)).paused

    def save_state(self, datasets: Sequence[str] = ()) -> bytes:
        """The sharding state as bytes, to be stored inside a model checkpoint."""
        return self._call("SaveState", pb.SaveStateRequest(datasets=list(datasets))).state \
            .SerializeToString()

    def restore_state(self, state: Union[bytes, pb.ShardingState]) -> pb.RestoreStateResponse:
        if isinstance(state, (bytes, bytearray)):
            msg = pb.ShardingState()
            try:
                msg.ParseFromString(bytes(state))
            except Exception as e:  # DecodeError; keep the type for the caller
                raise errors.IncompatibleState(f"sharding state bytes do not parse: {e}") from e
            state = msg
        return self._call("RestoreState", pb.RestoreStateRequest(state=state))

    def shards(self, dataset: str, task: Optional[Task] = None) -> Iterator[pb.Shard]:
        """Pulls shards until END; see :func:`pull_shards`."""
        session = _Session(lambda: self.get_shard(dataset, task),
                           lambda shard, nxt: self.report_done(shard, task, get_next=nxt),
                           lambda shard: self.report_failed(shard, 0, "abandoned", task))
        return pull_shards(session)


class HeldLeaseKeeper:
    """A thread of the trainer that tells the master, every ``every_seconds``, that the
    trainer is alive to settle ``datasets``' held leases (``KeepHeldLeases``).

    Why a thread: the trainer settles a dead worker's sparse leases from the PS on its
    main thread, between the steps it schedules; when that thread waits (a checkpoint's
    ``join`` while TF recovers a worker, an evaluation, a user's callback) longer than
    the master's ``--settle_seconds``, the master would re-issue those leases from its
    own, older count and everything the dead worker applied since its last report would
    be trained again (seen: 384 records twice after one kill). This thread runs no
    TensorFlow (the PS read stays on the main thread); once the trainer dies or hangs it
    stops, and the leases expire ``--settle_seconds`` later. Best effort: a failed call
    is logged and retried next period."""

    def __init__(self, address: str, datasets: Sequence[str], every_seconds: float = 1.0):
        if every_seconds <= 0:
            raise ValueError(f"every_seconds must be > 0, got {every_seconds}")
        self.datasets = list(datasets)
        self.every_seconds = every_seconds
        self._client = ShardingClient(address, timeout=max(2.0, every_seconds))
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.calls = 0

    def start(self) -> "HeldLeaseKeeper":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="antdt-held-lease-keeper",
                                            daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_seconds):
            for name in self.datasets:
                try:
                    self._client.keep_held_leases(name)
                    self.calls += 1
                except errors.AntdtError as e:
                    log.warning("could not keep %s's held leases: %s", name, e)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._client.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def leasing_started(dataset: pb.DatasetProgress) -> bool:
    """Whether the dataset's first shard was leased (training has begun): what starts a
    job's clock and its injections."""
    return bool(dataset.doing_shards or dataset.done_shards or dataset.epoch
                or dataset.finished)


def worker_split(progress: pb.GetProgressResponse) -> tuple[list[int], list[int]]:
    """``(shards, records)`` per worker index 0..n-1 from ``GetProgress``: what the master
    counted from each worker's own reports (0 for an index it never heard from)."""
    per = {t.task.index: (t.shards_done, t.records_done) for t in progress.tasks
           if t.task.type == "worker"}
    n = max(per, default=-1) + 1
    return ([per.get(w, (0, 0))[0] for w in range(n)],
            [per.get(w, (0, 0))[1] for w in range(n)])


class _Session:
    __slots__ = ("get", "done", "give_back")

    def __init__(self, get, done, give_back):
        self.get, self.done, self.give_back = get, done, give_back


def pull_shards(session: _Session, max_wait_seconds: float = 1.0) -> Iterator[pb.Shard]:
    """Yields shards until END, polling on WAIT.

    A shard is reported DONE (with the next request piggybacked) when the loop body
    that received it finishes. If the body raises or breaks, the shard is given back
    (FAILED, 0 records) so another trainer gets it at once. Use ``report_progress``
    inside the body for long shards.
    """
    resp = session.get()
    while True:
        if resp.status == pb.GetShardResponse.END:
            return
        if resp.status != pb.GetShardResponse.SHARD:
            time.sleep(min(max_wait_seconds, resp.retry_after_seconds or 0.1))
            resp = session.get()
            continue
        shard = resp.shard
        try:
            yield shard
        except BaseException:
            try:
                session.give_back(shard)
            except errors.AntdtError as e:  # best effort: the lease expires anyway
                logging.getLogger(__name__).warning("could not give back shard %d: %s",
                                                    shard.shard_id, e)
            raise
        resp = session.done(shard, True).next


_RECONNECT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


class ShardStream:
    """GetShard / ReportShard over one bidirectional stream (``ShardStream`` RPC).

    Same semantics and errors as the unary calls, at a fraction of their cost per call:
    what a trainer pulling many small shards should use. If the master goes away (a
    restart), the stream is reopened and the call re-sent, which is safe for the same
    reasons unary retries are (request ids, DUPLICATE). Every call has the client's
    deadline. Not thread-safe: one stream per trainer thread.
    """

    def __init__(self, client: ShardingClient, task: Optional[Task] = None):
        self._client = client
        self._task = task
        self._seq = 0
        self._requests: Optional[queue.SimpleQueue] = None
        self._call = None
        self._open()

    def _open(self) -> None:
        requests: queue.SimpleQueue = queue.SimpleQueue()

        def feed():
            while True:
                item = requests.get()
                if item is None:
                    return
                yield item

        self._requests = requests
        self._call = self._client._stub.ShardStream(feed(), wait_for_ready=True)

    def close(self) -> None:
        if self._requests is not None:
            self._requests.put(None)
        if self._call is not None:
            self._call.cancel()
        self._requests = self._call = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _roundtrip(self, field: str, message):
        if self._call is None:
            raise ValueError("the stream is closed")
        self._seq += 1
        request = pb.ShardStreamRequest(seq=self._seq, **{field: message})
        deadline = time.monotonic() + self._client.timeout
        while True:
            self._requests.put(request)
            call = self._call
            timer = threading.Timer(max(0.0, deadline - time.monotonic()), call.cancel)
            timer.start()
            try:
                response = next(call)
            except (grpc.RpcError, StopIteration) as e:
                timed_out = time.monotonic() >= deadline
                code = e.code() if isinstance(e, grpc.RpcError) else grpc.StatusCode.UNAVAILABLE
                if timed_out or code not in _RECONNECT:
                    if isinstance(e, grpc.RpcError) and not timed_out:
                        raise_typed(e, f"ShardStream.{field}")
                    raise MasterUnavailable(
                        f"ShardStream.{field}: no answer from {self._client.address} within "
                        f"{self._client.timeout:.0f}s") from e
                self.close()          # the master went away: reopen and re-send
                time.sleep(0.05)
                self._open()
                continue
            finally:
                timer.cancel()
            if response.seq != request.seq:
                raise RpcFailed(f"ShardStream answered call {response.seq}, expected {request.seq}")
            if response.HasField("error"):
                err = response.error
                cls = getattr(errors, err.type, None)
                if isinstance(cls, type) and issubclass(cls, errors.AntdtError):
                    raise cls(err.message)
                raise RpcFailed(f"ShardStream.{field}: {err.type or err.code}: {err.message}")
            return getattr(response, field)

    def get_shard(self, dataset: str) -> pb.GetShardResponse:
        return self._roundtrip("get_shard", self._client._get_request(dataset, self._task))

    def report_done(self, shard: pb.Shard, get_next: bool = False) -> pb.ReportShardResponse:
        return self._roundtrip("report_shard", self._client._report_request(
            shard, pb.ReportShardRequest.DONE, shard.length, self._task, get_next))

    def report_progress(self, shard: pb.Shard, records: int) -> pb.ReportShardResponse:
        return self._roundtrip("report_shard", self._client._report_request(
            shard, pb.ReportShardRequest.PROGRESS, records, self._task))

    def report_failed(self, shard: pb.Shard, records: int = 0,
                      error: str = "") -> pb.ReportShardResponse:
        return self._roundtrip("report_shard", self._client._report_request(
            shard, pb.ReportShardRequest.FAILED, records, self._task, error=error))

    def shards(self, dataset: str) -> Iterator[pb.Shard]:
        """Pulls shards until END over this stream; see :func:`pull_shards`."""
        return pull_shards(_Session(lambda: self.get_shard(dataset),
                                    lambda shard, nxt: self.report_done(shard, get_next=nxt),
                                    lambda shard: self.report_failed(shard, 0, "abandoned")))
