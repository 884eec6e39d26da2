"""The sharding ledger's records and vocabulary: the lease configuration, one dataset's
live state (:class:`Run`), a lease (:class:`Lease`), a task (:class:`TaskRecord`), a
backup pair (:class:`Pair`), the event kinds as plain ints, and the checks every request
passes. Pure Python over the wire protos; the state machine is in :mod:`.ledger`."""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Optional

from antdt_tf import limits
from antdt_tf.errors import InvalidRequest, shown
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.plan import DataFile, DatasetSpec, ShardPlan

STATE_FORMAT_VERSION = 1
TASK_TYPE_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")   # fullmatch
MAX_TASK_INDEX = limits.MAX_TASK_INDEX
RECENT_DONE = 16
MAX_POISONED_IDS = 100

Outcome = pb.ReportShardRequest.Outcome
Settle = pb.SettleEvent.Kind
# Plain ints: protobuf enum attribute lookups are slow on the hot path.
DONE, FAILED, PROGRESS = Outcome.DONE, Outcome.FAILED, Outcome.PROGRESS
S_DONE, S_FAILED, S_PROGRESS, S_EXPIRED = Settle.DONE, Settle.FAILED, Settle.PROGRESS, Settle.EXPIRED
S_STOLEN, S_HELD, S_RELEASED = Settle.STOLEN, Settle.HELD, Settle.RELEASED
SETTLE_OF = {DONE: S_DONE, FAILED: S_FAILED, PROGRESS: S_PROGRESS}
SHARD = pb.GetShardResponse.SHARD
WAIT = pb.GetShardResponse.WAIT
END = pb.GetShardResponse.END
ACCEPTED = pb.ReportShardResponse.ACCEPTED
DUPLICATE = pb.ReportShardResponse.DUPLICATE


@dataclasses.dataclass(frozen=True)
class LeaseConfig:
    """How long a task may hold a shard without reporting.

    A lease lasts ``factor`` times the expected time of its remaining records, expected
    from the *slower* of the holder's own observed seconds-per-record and the dataset's
    (so a merely slow worker is never robbed), clamped to
    [``min_seconds``, ``max_seconds``]. Before anything was observed it is
    ``initial_seconds``. PROGRESS reports renew it.
    """

    min_seconds: float = 30.0
    initial_seconds: float = 600.0
    max_seconds: float = 24 * 3600.0
    factor: float = 4.0
    max_failures: int = 3
    # how long a lease with sparse reports is held for its trainer to settle it from
    # the PS after its holder died (then it goes back from the master's own offset);
    # renewed while the trainer says it is alive (keep_held)
    settle_seconds: float = 10.0

    def __post_init__(self):
        if not 0 < self.min_seconds <= self.max_seconds:
            raise ValueError("need 0 < lease min_seconds <= max_seconds")
        if not self.min_seconds <= self.initial_seconds <= self.max_seconds:
            raise ValueError("lease initial_seconds must lie in [min_seconds, max_seconds]")
        if self.factor < 1:
            raise ValueError("lease factor must be >= 1")
        if self.max_failures < 1:
            raise ValueError("max_failures must be >= 1")
        if self.settle_seconds <= 0:
            raise ValueError("settle_seconds must be > 0")


def spec_from_proto(msg: pb.DatasetSpec) -> DatasetSpec:
    return DatasetSpec(name=msg.name, records_per_shard=msg.records_per_shard,
                       num_epochs=msg.num_epochs, num_records=msg.num_records,
                       files=tuple(DataFile(f.path, f.num_records) for f in msg.files),
                       shuffle=msg.shuffle, seed=msg.seed, static_workers=msg.static_workers,
                       tail_stealing=msg.tail_stealing, backup_leases=msg.backup_leases)


def spec_to_proto(spec: DatasetSpec) -> pb.DatasetSpec:
    return pb.DatasetSpec(name=spec.name, records_per_shard=spec.records_per_shard,
                          num_epochs=spec.num_epochs, num_records=spec.num_records,
                          files=[pb.DataFile(path=f.path, num_records=f.num_records)
                                 for f in spec.files],
                          shuffle=spec.shuffle, seed=spec.seed,
                          static_workers=spec.static_workers,
                          tail_stealing=spec.tail_stealing, backup_leases=spec.backup_leases)


def task_name(task: pb.TaskId) -> str:
    return f"{task.type}:{task.index}#{task.incarnation}"


def validate_task(task: pb.TaskId) -> None:
    if not TASK_TYPE_RE.fullmatch(task.type):
        raise InvalidRequest(f"task type {shown(task.type)} is invalid: use 1-32 characters "
                             "of [a-z0-9_], starting with a letter, e.g. 'worker'")
    if not 0 <= task.index <= MAX_TASK_INDEX:
        raise InvalidRequest(f"task index {task.index} out of range [0, {MAX_TASK_INDEX}]")
    check_incarnation(task.incarnation)


def check_incarnation(incarnation: int) -> None:
    if not 0 <= incarnation <= limits.MAX_INCARNATION:
        raise InvalidRequest(f"task incarnation must be in [0, {limits.MAX_INCARNATION}], "
                             f"got {incarnation}")


def check_finite(value: float, what: str) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise InvalidRequest(f"{what} must be a finite number >= 0, got {value}")


def check_counter(value: int, what: str) -> None:
    if not 0 <= value <= limits.MAX_COUNTER:
        raise InvalidRequest(f"{what} must be in [0, {limits.MAX_COUNTER}], got {value}")


def names_for_error(names) -> str:
    """Registered dataset names for an error message: the first few, never all."""
    names = sorted(names)
    if not names:
        return "none"
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(names[:5]) + more


def describe_spec_diff(old: DatasetSpec, new: DatasetSpec) -> str:
    diffs = []
    for field in dataclasses.fields(DatasetSpec):
        a, b = getattr(old, field.name), getattr(new, field.name)
        if a != b:
            if field.name == "files":
                a, b = f"{len(a)} files", f"{len(b)} files"
            diffs.append(f"{field.name}: registered {a!r}, now {b!r}")
    return "; ".join(diffs)


class Pair:
    """A lease and its speculative duplicate (backup leases): the duplicate starts where
    the original's last report left it, so together they cover [start, end) of the shard
    without a gap; records are counted once, by how far the two together reach (``end``)."""

    __slots__ = ("end",)

    def __init__(self, end: int):
        self.end = end


class Lease:
    __slots__ = ("lease_id", "dataset", "shard_id", "epoch", "offset", "length", "applied",
                 "task_key", "incarnation", "issued_at", "lease_seconds", "deadline", "attempt",
                 "last_delta", "pair", "partner", "backup_of", "sparse", "held")

    def __init__(self, lease_id, dataset, shard_id, epoch, offset, length, task_key, incarnation,
                 issued_at, lease_seconds, attempt):
        self.lease_id = lease_id
        self.dataset = dataset
        self.shard_id = shard_id
        self.epoch = epoch
        self.offset = offset          # records of the shard trained before this lease
        self.length = length          # records this lease covers
        self.applied = 0              # of those, trained so far (PROGRESS)
        self.task_key = task_key
        self.incarnation = incarnation
        self.issued_at = issued_at
        self.lease_seconds = lease_seconds
        self.deadline = issued_at + lease_seconds
        self.attempt = attempt
        self.last_delta = 0           # records of the latest report: the holder's batch size
        self.pair: Optional[Pair] = None   # backup leases: shared with the partner
        self.partner = 0              # the partner's lease id while both are DOING
        self.backup_of = 0            # this lease duplicates that one (the original)
        # reported per lease and closure, not per batch: the exact offset is on the PS
        self.sparse = False
        # sparse, and its holder died or went silent: kept from re-issue until the
        # trainer settles it from the PS (ApplyLeaseRecord) or settle_seconds pass
        self.held = False


class Run:
    """One dataset's live state."""

    def __init__(self, spec: DatasetSpec):
        self.spec = spec
        self.plan = ShardPlan(spec)
        self.spec_bytes = spec_to_proto(spec).ByteSize()
        self.epoch = 0
        self.cursor = 0
        self.order = self.plan.order(0)
        self.requeue: collections.deque[tuple[int, int]] = collections.deque()  # (shard, offset)
        self.start_epoch()
        self.doing: dict[int, Lease] = {}
        self.poisoned: dict[int, int] = {}     # shard -> offset
        self.failures: dict[int, int] = {}     # shard -> failed attempts this epoch
        self.records_done_epoch = 0
        self.records_done_total = 0
        self.seconds_per_record = 0.0
        # when the first shard was issued / the last epoch finished (the master's clock,
        # from the journal, so a replay gives the same); for JCT measurements
        self.started_unix = 0.0
        self.finished_unix = 0.0
        self.stolen_leases = 0
        self.backup_leases = 0

    @property
    def finished(self) -> bool:
        return self.epoch >= self.spec.num_epochs

    def start_epoch(self) -> None:
        """Static sharding: every shard of the epoch is TODO for its owner from the start
        (all 'issued' to the requeue in order; each worker takes only its own)."""
        if self.spec.static_workers and not self.finished:
            self.requeue.extend((self.order(p), 0) for p in range(self.cursor,
                                                                 self.plan.num_shards))
            self.cursor = self.plan.num_shards

    def owner(self, shard_id: int) -> int:
        """Static sharding: the worker index whose block of the epoch's order holds it."""
        return self.order.inverse(shard_id) * self.spec.static_workers // self.plan.num_shards

    def next_for(self, task: pb.TaskId) -> Optional[tuple[int, int]]:
        """The (shard, offset) to issue to ``task`` next, None if nothing is for it."""
        if not self.spec.static_workers:
            if self.requeue:
                return self.requeue[0]
            return (self.order(self.cursor), 0) if self.cursor < self.plan.num_shards else None
        if task.type != "worker":
            return None
        return next((e for e in self.requeue if self.owner(e[0]) == task.index), None)

    def todo_shards(self) -> int:
        return 0 if self.finished else self.plan.num_shards - self.cursor + len(self.requeue)


class TaskRecord:
    __slots__ = ("key", "type", "index", "incarnation", "dead", "shards_done", "records_done",
                 "failures", "seconds_per_record", "leases", "recent_done", "last_request",
                 "batch_records")

    def __init__(self, task: pb.TaskId):
        self.key = f"{task.type}:{task.index}"
        self.type = task.type
        self.index = task.index
        self.incarnation = task.incarnation
        self.dead = False
        self.shards_done = 0
        self.records_done = 0
        self.failures = 0
        self.seconds_per_record = 0.0
        self.leases: set[int] = set()
        self.recent_done: collections.deque[int] = collections.deque(maxlen=RECENT_DONE)
        self.last_request: dict[str, tuple[int, int]] = {}  # dataset -> (request_id, lease)
        self.batch_records = 0        # records of its latest PROGRESS report: its batch size

    def task_id(self) -> pb.TaskId:
        return pb.TaskId(type=self.type, index=self.index, incarnation=self.incarnation)


def ewma(old: float, new: float, alpha: float) -> float:
    return new if old <= 0 else (1 - alpha) * old + alpha * new

