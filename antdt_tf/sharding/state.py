"""ShardState: the master's record of every shard of every registered dataset.

Lifecycle of a shard within one epoch::

    TODO  --GetShard-->  DOING (a lease held by one task incarnation)
    DOING --DONE------>  DONE
    DOING --FAILED / lease expired / holder died / holder relaunched-->
          TODO again, from the holder's last applied offset, ahead of never-issued shards
          (or POISONED once the shard failed ``max_failures`` times: the job goes on)
    all shards DONE or POISONED --> next epoch (a new seeded order) ... after the last: END

Representation (bounded memory for huge datasets): never-issued shards are implied by a
cursor into the epoch's permutation; only shards that were issued and are not DONE
(``requeue``, ``doing``, ``poisoned``) are stored. DONE = issued minus those, so no
shard can be counted DONE twice by construction.

Every change is an *event* (a ``JournalEntry`` proto): a public method validates the
request, builds the event, hands it to the ``journal`` callback (the persistent store)
and only then applies it. Replaying the journal through :meth:`ShardState.apply`
rebuilds exactly the state that was acknowledged. Bad requests raise a typed
:mod:`antdt_tf.errors` exception before any event exists, so they never change state.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import math
import re
import time
from typing import Callable, Iterable, Optional

from antdt_tf import limits
from antdt_tf.errors import (CorruptState, DatasetConflict, IncompatibleState, InvalidRequest,
                             LeaseNotHeld, StaleIncarnation, UnknownDataset, UnknownTask,
                             shown)
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.plan import DataFile, DatasetSpec, ShardPlan

STATE_FORMAT_VERSION = 1
_TASK_TYPE_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")   # fullmatch
_MAX_TASK_INDEX = limits.MAX_TASK_INDEX
_RECENT_DONE = 16
_MAX_POISONED_IDS = 100

Outcome = pb.ReportShardRequest.Outcome
Settle = pb.SettleEvent.Kind
# Plain ints: protobuf enum attribute lookups are slow on the hot path.
_DONE, _FAILED, _PROGRESS = Outcome.DONE, Outcome.FAILED, Outcome.PROGRESS
_S_DONE, _S_FAILED, _S_PROGRESS, _S_EXPIRED = Settle.DONE, Settle.FAILED, Settle.PROGRESS, Settle.EXPIRED
_S_STOLEN, _S_HELD, _S_RELEASED = Settle.STOLEN, Settle.HELD, Settle.RELEASED
# tail stealing: take over a lease only when its holder would need this many times longer
# for the rest than the idle task, and at least two batches are left after the one the
# holder is training now
_STEAL_SPEEDUP = 1.5
_STEAL_MIN_BATCHES = 2
# sparse reports: a lease is reported after every batch anyway (so that it can be
# stolen or backed up) when few shards are left to issue (this many per live worker) or
# its holder is this much slower than the dataset's pace
_DENSE_TAIL_SHARDS_PER_WORKER = 2
_DENSE_SLOWNESS = 1.25
_SETTLE_OF = {_DONE: _S_DONE, _FAILED: _S_FAILED, _PROGRESS: _S_PROGRESS}
_SHARD = pb.GetShardResponse.SHARD
_WAIT = pb.GetShardResponse.WAIT
_END = pb.GetShardResponse.END
_ACCEPTED = pb.ReportShardResponse.ACCEPTED
_DUPLICATE = pb.ReportShardResponse.DUPLICATE


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
    if not _TASK_TYPE_RE.fullmatch(task.type):
        raise InvalidRequest(f"task type {shown(task.type)} is invalid: use 1-32 characters "
                             "of [a-z0-9_], starting with a letter, e.g. 'worker'")
    if not 0 <= task.index <= _MAX_TASK_INDEX:
        raise InvalidRequest(f"task index {task.index} out of range [0, {_MAX_TASK_INDEX}]")
    _check_incarnation(task.incarnation)


def _check_incarnation(incarnation: int) -> None:
    if not 0 <= incarnation <= limits.MAX_INCARNATION:
        raise InvalidRequest(f"task incarnation must be in [0, {limits.MAX_INCARNATION}], "
                             f"got {incarnation}")


def _finite(value: float, what: str) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise InvalidRequest(f"{what} must be a finite number >= 0, got {value}")


def _counter(value: int, what: str) -> None:
    if not 0 <= value <= limits.MAX_COUNTER:
        raise InvalidRequest(f"{what} must be in [0, {limits.MAX_COUNTER}], got {value}")


def _names(names) -> str:
    """Registered dataset names for an error message: the first few, never all."""
    names = sorted(names)
    if not names:
        return "none"
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(names[:5]) + more


class _Pair:
    """A lease and its speculative duplicate (backup leases): the duplicate starts where
    the original's last report left it, so together they cover [start, end) of the shard
    without a gap; records are counted once, by how far the two together reach (``end``)."""

    __slots__ = ("end",)

    def __init__(self, end: int):
        self.end = end


class _Lease:
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
        self.pair: Optional[_Pair] = None   # backup leases: shared with the partner
        self.partner = 0              # the partner's lease id while both are DOING
        self.backup_of = 0            # this lease duplicates that one (the original)
        # reported per lease and closure, not per batch: the exact offset is on the PS
        self.sparse = False
        # sparse, and its holder died or went silent: kept from re-issue until the
        # trainer settles it from the PS (ApplyLeaseRecord) or settle_seconds pass
        self.held = False


class _Run:
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
        self.doing: dict[int, _Lease] = {}
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


class _Task:
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
        self.recent_done: collections.deque[int] = collections.deque(maxlen=_RECENT_DONE)
        self.last_request: dict[str, tuple[int, int]] = {}  # dataset -> (request_id, lease)
        self.batch_records = 0        # records of its latest PROGRESS report: its batch size

    def task_id(self) -> pb.TaskId:
        return pb.TaskId(type=self.type, index=self.index, incarnation=self.incarnation)


def _ewma(old: float, new: float, alpha: float) -> float:
    return new if old <= 0 else (1 - alpha) * old + alpha * new


class ShardState:
    """The sharding state machine. Not thread-safe: the service serialises calls."""

    def __init__(self, config: LeaseConfig = LeaseConfig(),
                 journal: Optional[Callable[[pb.JournalEntry], None]] = None,
                 clock: Callable[[], float] = time.time):
        self.config = config
        self._journal = journal
        self._clock = clock
        self._runs: dict[str, _Run] = {}
        self._tasks: dict[str, _Task] = {}
        self._next_lease_id = 1
        self._deadlines: list[tuple[float, int, str]] = []  # heap (deadline, lease, dataset)
        self.last_expired: list[str] = []
        # Tail stealing counts the holder's batch in flight as applied. Until the holder
        # reports it (refused: the lease is gone), that is a promise, not a fact: a
        # checkpoint taken meanwhile (the trainer drained its steps while that batch
        # waited in the holder's pipeline) must not claim it. (dataset, stolen lease) ->
        # (shard, offset the holder reported, offset the rest was issued from). Soft
        # state: live steals only, not rebuilt from the journal.
        self._unconfirmed_steals: dict[tuple[str, int], tuple[int, int, int]] = {}

    # ------------------------------------------------------------------ queries

    @property
    def datasets(self) -> list[str]:
        return list(self._runs)

    def _run(self, dataset: str) -> _Run:
        run = self._runs.get(dataset)
        if run is None:
            raise UnknownDataset(f"unknown dataset {shown(dataset)}; registered: "
                                 f"{_names(self._runs)} (call RegisterDataset first)")
        return run

    def _lookup(self, task: pb.TaskId) -> Optional[_Task]:
        t = self._tasks.get(f"{task.type}:{task.index}")
        if t is None:
            validate_task(task)   # never seen: check the id in full (known ids were checked)
        else:
            _check_incarnation(task.incarnation)
        return t

    def _check_new_task(self, task: pb.TaskId) -> None:
        if (f"{task.type}:{task.index}" not in self._tasks
                and len(self._tasks) >= limits.MAX_TASKS):
            raise InvalidRequest(f"the master knows {len(self._tasks)} tasks already, at most "
                                 f"{limits.MAX_TASKS}; task {task_name(task)} is refused")

    def _known_task(self, task: pb.TaskId, t: Optional[_Task] = None) -> _Task:
        """The task record for a report; refuses unknown, stale and dead incarnations."""
        t = t or self._lookup(task)
        if t is None or task.incarnation > t.incarnation:
            raise UnknownTask(f"unknown task {task_name(task)}: it never asked for a shard "
                              "(GetShard registers a task incarnation)")
        if task.incarnation < t.incarnation:
            raise StaleIncarnation(f"task {task_name(task)} was replaced by incarnation "
                                   f"{t.incarnation}; its leases were released")
        if t.dead:
            raise StaleIncarnation(f"task {task_name(task)} was declared dead; relaunch it "
                                   "with a higher incarnation")
        return t

    def task_incarnation(self, task_type: str, index: int) -> int:
        """The latest incarnation of a task seen so far, -1 if never seen."""
        t = self._tasks.get(f"{task_type}:{index}")
        return t.incarnation if t is not None else -1

    def task_records(self, task_type: str, index: int) -> int:
        """Records the latest incarnation of a task has trained (0 if never seen)."""
        t = self._tasks.get(f"{task_type}:{index}")
        return t.records_done if t is not None else 0

    def lease_length(self, dataset: str, lease_id: int) -> Optional[int]:
        """Records of an active (DOING) lease, None if it is not active."""
        lease = self._run(dataset).doing.get(lease_id)
        return lease.length if lease is not None else None

    def progress(self, dataset: str = "") -> pb.GetProgressResponse:
        runs = [self._run(dataset)] if dataset else list(self._runs.values())
        out = pb.GetProgressResponse()
        for run in runs:
            n = run.plan.num_shards
            todo, poisoned = run.todo_shards(), len(run.poisoned)
            doing = len({le.shard_id for le in run.doing.values()})   # a pair is one shard
            out.datasets.append(pb.DatasetProgress(
                name=run.spec.name, epoch=run.epoch, num_epochs=run.spec.num_epochs,
                shards_per_epoch=n, todo_shards=todo, doing_shards=doing,
                done_shards=n - todo - doing - poisoned, poisoned_shards=poisoned,
                records_per_epoch=run.plan.num_records,
                records_done_epoch=run.records_done_epoch,
                records_done_total=run.records_done_total, finished=run.finished,
                started_unix=run.started_unix, finished_unix=run.finished_unix,
                stolen_leases=run.stolen_leases, backup_leases=run.backup_leases,
                poisoned_shard_ids=sorted(run.poisoned)[:_MAX_POISONED_IDS],
                seconds_per_record=run.seconds_per_record,
                held=[pb.HeldLease(lease_id=le.lease_id, applied=le.applied, holder=pb.TaskId(
                    type=self._tasks[le.task_key].type, index=self._tasks[le.task_key].index,
                    incarnation=le.incarnation)) for le in run.doing.values() if le.held]))
        for t in self._tasks.values():
            out.tasks.append(pb.TaskProgress(
                task=t.task_id(), state="dead" if t.dead else "active",
                shards_done=t.shards_done, records_done=t.records_done,
                doing_shards=len(t.leases), failures=t.failures,
                seconds_per_record=t.seconds_per_record))
        return out

    # ---------------------------------------------------------------- commands

    def attach_journal(self, journal: Callable[[pb.JournalEntry], None]) -> None:
        """Every later event is passed to ``journal`` before it is applied."""
        self._journal = journal

    def _commit(self, entry: pb.JournalEntry):
        if self._journal is not None:
            self._journal(entry)
        return self.apply(entry)

    def _now(self) -> float:
        return self._clock()

    def register_dataset(self, spec: DatasetSpec) -> tuple[bool, int, int]:
        """Registers ``spec``; idempotent for an identical spec. Returns
        (created, shards per epoch, records per epoch)."""
        existing = self._runs.get(spec.name)
        if existing is not None:
            if existing.spec != spec:
                raise DatasetConflict(
                    f"dataset {spec.name!r} is already registered with different parameters "
                    f"({_describe_spec_diff(existing.spec, spec)}); use a new name or restart "
                    "the job with a fresh state_dir")
            return False, existing.plan.num_shards, existing.plan.num_records
        self._check_dataset_room([spec_to_proto(spec)])
        self._commit(pb.JournalEntry(time=self._now(), register=spec_to_proto(spec)))
        run = self._runs[spec.name]
        return True, run.plan.num_shards, run.plan.num_records

    def _admit(self, task: pb.TaskId) -> _Task:
        """The task record for a GetShard: registers new tasks and newer incarnations."""
        t = self._lookup(task)
        if t is None or task.incarnation > t.incarnation:
            self._check_new_task(task)
            self._commit(pb.JournalEntry(time=self._now(), task_joined=task))
            return self._tasks[f"{task.type}:{task.index}"]
        return self._known_task(task, t)

    def join_task(self, task: pb.TaskId) -> bool:
        """A new incarnation of ``task`` announces itself (a worker's pipeline opened a
        dataset) before it asks for a shard: the old incarnation is gone now, so its
        leases are released at once (sparse ones held for the trainer to settle) rather
        than at the new incarnation's first GetShard, which may come much later (a Keras
        chief schedules nothing on a recovered worker while it waits for another one's
        closure; seen: the old leases then sat until their 30 s expiry, the job idle).
        Returns False if the incarnation is not newer (nothing changes)."""
        t = self._lookup(task)
        if t is not None and task.incarnation <= t.incarnation:
            return False
        self._check_new_task(task)
        self._commit(pb.JournalEntry(time=self._now(), task_joined=task))
        return True

    def get_shard(self, dataset: str, task: pb.TaskId, request_id: int = 0,
                  sparse_ok: bool = False) -> pb.GetShardResponse:
        """``sparse_ok``: the task's trainer records per-batch offsets on the PS and can
        settle a lease from there (ApplyLeaseRecord), so the lease may be reported only per
        lease and closure (see :meth:`_wants_dense`)."""
        run = self._run(dataset)
        t = self._admit(task)
        if request_id:
            last = t.last_request.get(dataset)
            if last is not None and last[0] == request_id:
                lease = run.doing.get(last[1])
                if lease is not None and lease.task_key == t.key:
                    return pb.GetShardResponse(status=_SHARD,
                                               shard=self._shard_msg(run, lease))
        if run.finished:
            return pb.GetShardResponse(status=_END)
        nxt = run.next_for(task)
        if nxt is None and run.spec.tail_stealing:
            victim, in_flight = self._steal_candidate(run, t)
            if victim is not None:
                reported = victim.offset + victim.applied
                self._commit(pb.JournalEntry(time=self._now(), settle=pb.SettleEvent(
                    dataset=dataset, lease_id=victim.lease_id, kind=_S_STOLEN,
                    records_processed=victim.applied + in_flight)))
                self._unconfirmed_steals[dataset, victim.lease_id] = (
                    victim.shard_id, reported, reported + in_flight)
                nxt = run.next_for(task)
        if nxt is None and run.spec.backup_leases:
            original, _ = self._steal_candidate(run, t, unpaired=True)
            if original is not None:
                offset = original.offset + original.applied
                lease = self._commit(pb.JournalEntry(time=self._now(), issue=pb.IssueEvent(
                    dataset=dataset, task=task, lease_id=self._next_lease_id,
                    lease_seconds=self._lease_seconds(
                        run, t, run.plan.shard_length(original.shard_id) - offset),
                    request_id=request_id, shard_id=original.shard_id, offset=offset,
                    backup_of=original.lease_id)))
                return pb.GetShardResponse(status=_SHARD, shard=self._shard_msg(run, lease))
        if nxt is None:
            return pb.GetShardResponse(status=_WAIT,
                                       retry_after_seconds=self._retry_after(run))
        shard_id, offset = nxt
        remaining = run.plan.shard_length(shard_id) - offset
        entry = pb.JournalEntry(time=self._now(), issue=pb.IssueEvent(
            dataset=dataset, task=task, lease_id=self._next_lease_id,
            lease_seconds=self._lease_seconds(run, t, remaining), request_id=request_id,
            shard_id=shard_id, offset=offset,
            sparse_reports=sparse_ok and not self._wants_dense(run, t)))
        lease = self._commit(entry)
        return pb.GetShardResponse(status=_SHARD,
                                   shard=self._shard_msg(run, lease))

    def report_shard(self, req: pb.ReportShardRequest) -> pb.ReportShardResponse:
        run, t = self._report_target(req)
        lease = run.doing.get(req.lease_id)
        if lease is None or lease.task_key != t.key or lease.incarnation != req.task.incarnation:
            if lease is None:   # a holder reporting its batch in flight when it was stolen
                self._unconfirmed_steals.pop((req.dataset, req.lease_id), None)
            if req.outcome == _DONE and req.lease_id in t.recent_done:
                resp = pb.ReportShardResponse(result=_DUPLICATE)
                if req.get_next:
                    resp.next.CopyFrom(self.get_shard(req.dataset, req.task, req.next_request_id))
                return resp
            raise LeaseNotHeld(
                f"lease {req.lease_id} (dataset {req.dataset}, shard {req.shard_id}, epoch "
                f"{req.epoch}) is not held by {task_name(req.task)}: it was re-issued after a "
                "failure, expiry or restore, or already settled; these records were not counted, "
                "drop the shard and ask for the next one")
        if lease.held:
            # its holder went silent (expired) and now reports again: its own word on how
            # far it got settles the lease; the rest is no longer its to train
            if lease.shard_id == req.shard_id and 0 <= req.records_processed <= lease.length:
                self._commit(pb.JournalEntry(time=self._now(), settle=pb.SettleEvent(
                    dataset=req.dataset, lease_id=lease.lease_id, kind=_S_RELEASED,
                    records_processed=max(lease.applied, req.records_processed))))
            raise LeaseNotHeld(
                f"lease {req.lease_id} (dataset {req.dataset}, shard {req.shard_id}) of "
                f"{task_name(req.task)} expired while it was silent; its rest goes back to "
                "TODO from what this report says was applied: drop the shard")
        self._check_report(req, lease)
        kind = _SETTLE_OF[req.outcome]
        lease_seconds = 0.0
        if kind == _S_PROGRESS:
            lease_seconds = self._lease_seconds(run, t, lease.length - req.records_processed)
        self._commit(pb.JournalEntry(time=self._now(), settle=pb.SettleEvent(
            dataset=req.dataset, lease_id=lease.lease_id, kind=kind,
            records_processed=req.records_processed, lease_seconds=lease_seconds)))
        resp = pb.ReportShardResponse(result=_ACCEPTED)
        if req.get_next:
            resp.next.CopyFrom(self.get_shard(req.dataset, req.task, req.next_request_id))
        return resp

    def _report_target(self, req: pb.ReportShardRequest):
        """The dataset run and known task a report is about, its outcome and count checked."""
        run = self._run(req.dataset)
        t = self._known_task(req.task)
        if req.outcome not in (_DONE, _FAILED, _PROGRESS):
            raise InvalidRequest(f"report outcome must be DONE, FAILED or PROGRESS, got {req.outcome}")
        if req.records_processed < 0:
            raise InvalidRequest(f"records_processed must be >= 0, got {req.records_processed}")
        return run, t

    def precheck_report(self, req: pb.ReportShardRequest) -> None:
        """Raises the InvalidRequest that :meth:`report_shard` would raise for ``req``,
        changing nothing (so a batch of reports is refused whole, before any applies)."""
        run, t = self._report_target(req)
        lease = run.doing.get(req.lease_id)
        if (lease is not None and lease.task_key == t.key and not lease.held
                and lease.incarnation == req.task.incarnation):
            self._check_report(req, lease)

    @staticmethod
    def _check_report(req: pb.ReportShardRequest, lease: _Lease) -> None:
        if lease.shard_id != req.shard_id or lease.epoch != req.epoch:
            raise InvalidRequest(
                f"lease {lease.lease_id} is for shard {lease.shard_id} epoch {lease.epoch}, the "
                f"report names shard {req.shard_id} epoch {req.epoch}")
        if req.records_processed > lease.length:
            raise InvalidRequest(
                f"records_processed {req.records_processed} exceeds the lease's {lease.length} "
                f"records (shard {lease.shard_id})")
        if req.outcome == _DONE and req.records_processed != lease.length:
            raise InvalidRequest(
                f"DONE must report all {lease.length} records of lease {lease.lease_id}, got "
                f"{req.records_processed}; report FAILED to give back the rest")
        if req.records_processed < lease.applied:
            raise InvalidRequest(
                f"records_processed {req.records_processed} is below the {lease.applied} already "
                f"reported for lease {lease.lease_id}; progress never goes back")

    def report_task_failure(self, task: pb.TaskId) -> int:
        """Declares ``task`` dead; its leases go back to TODO now — those with sparse
        reports are held for its trainer to settle instead. Returns how many leases it
        had (held ones included).

        A late report about an incarnation that was already replaced is accepted and
        changes nothing (its leases were released when the new incarnation joined)."""
        validate_task(task)
        t = self._tasks.get(f"{task.type}:{task.index}")
        if t is None:
            raise UnknownTask(f"unknown task {task_name(task)}: it never asked for a shard")
        if task.incarnation < t.incarnation or (task.incarnation == t.incarnation and t.dead):
            return 0
        released = len(t.leases)
        self._commit(pb.JournalEntry(time=self._now(), task_failed=task))
        return released

    def apply_record(self, dataset: str, lease_id: int, holder: pb.TaskId,
                     records_applied: int) -> bool:
        """How far a lease with sparse reports got, as its holder's steps recorded it on
        the PS (-1: nothing recorded for it: the master's count is exact). A held lease
        (see DatasetProgress.held) goes back to TODO from there, or is DONE; a lease its
        holder still trains is counted up to there (a checkpoint must agree with the
        model). False if the lease is not that holder's any more (settled before,
        expired, stolen, restored): a repeated or late record changes nothing."""
        run = self._run(dataset)
        validate_task(holder)
        lease = run.doing.get(lease_id)
        if (lease is None or not lease.sparse or lease.incarnation != holder.incarnation
                or lease.task_key != f"{holder.type}:{holder.index}"):
            return False
        if records_applied > lease.length or records_applied < -1:
            raise InvalidRequest(
                f"records_applied {records_applied} of lease {lease_id} is outside "
                f"[-1, {lease.length}] (the lease's records)")
        applied = max(lease.applied, records_applied)
        if lease.held:
            kind, lease_seconds = _S_RELEASED, 0.0
        elif applied == lease.length:
            kind, lease_seconds = _S_DONE, 0.0
        elif applied > lease.applied:
            kind = _S_PROGRESS
            lease_seconds = self._lease_seconds(run, self._tasks[lease.task_key],
                                                lease.length - applied)
        else:
            return True
        self._commit(pb.JournalEntry(time=self._now(), settle=pb.SettleEvent(
            dataset=dataset, lease_id=lease_id, kind=kind, records_processed=applied,
            lease_seconds=lease_seconds)))
        return True

    def keep_held(self, dataset: str) -> int:
        """The trainer that settles ``dataset``'s held leases is alive: their settle
        timeout starts over (not journaled: a deadline is soft state, renewed after a
        master restart by :meth:`grant_grace`). Returns how many leases are held."""
        run = self._run(dataset)
        now = self._now()
        held = 0
        for lease in run.doing.values():
            if lease.held:
                held += 1
                lease.deadline = now + self.config.settle_seconds
                heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id, dataset))
        return held

    def expire_leases(self) -> int:
        """Takes back leases whose holders stopped reporting. Returns how many."""
        now = self._now()
        expired = 0
        self.last_expired = []   # what expired, for the log: a holder that went silent
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, lease_id, dataset = heapq.heappop(self._deadlines)
            run = self._runs.get(dataset)
            lease = run.doing.get(lease_id) if run else None
            if lease is None or lease.deadline != deadline:
                continue  # settled or renewed
            self.last_expired.append(
                f"lease {lease_id} (dataset {dataset}, shard {lease.shard_id}, "
                f"{lease.applied}/{lease.length} applied) of {lease.task_key}"
                f"#{lease.incarnation}, issued {now - lease.issued_at:.1f}s ago")
            # a sparse lease's holder may have applied more than it reported: held for
            # its trainer to settle from the PS (EXPIRED once that times out too)
            kind = _S_HELD if lease.sparse and not lease.held else _S_EXPIRED
            self._commit(pb.JournalEntry(time=now, settle=pb.SettleEvent(
                dataset=dataset, lease_id=lease_id, kind=kind,
                records_processed=lease.applied)))
            expired += 1
        return expired

    def restore_state(self, state: pb.ShardingState) -> tuple[list[str], int]:
        """Rolls the datasets in ``state`` back to it (see RestoreStateRequest)."""
        self._check_state(state, keep_doing=False)
        for ds in state.datasets:
            run = self._runs.get(ds.spec.name)
            if run is not None and run.spec != spec_from_proto(ds.spec):
                raise IncompatibleState(
                    f"dataset {ds.spec.name!r}: the snapshot was taken with different parameters "
                    f"({_describe_spec_diff(run.spec, spec_from_proto(ds.spec))})")
        self._check_dataset_room([ds.spec for ds in state.datasets])
        self._commit(pb.JournalEntry(time=self._now(), restore=state))
        return ([ds.spec.name for ds in state.datasets],
                sum(len(ds.doing) for ds in state.datasets))

    # ---------------------------------------------------------------- snapshot

    def snapshot(self, datasets: Iterable[str] = (), with_tasks: bool = True,
                 for_checkpoint: bool = False) -> pb.ShardingState:
        """The state as a message. ``for_checkpoint``: taken with no training step in
        flight (SaveState), so a stolen lease's batch its holder has not reported yet was
        not applied: its rest, while nobody trained any of it, is given from the holder's
        last report on (restored, that batch is trained again instead of lost)."""
        names = list(datasets) or list(self._runs)
        out = pb.ShardingState(format_version=STATE_FORMAT_VERSION, next_lease_id=self._next_lease_id)
        for name in names:
            run = self._run(name)
            ds = out.datasets.add(epoch=run.epoch, cursor=run.cursor,
                                  records_done_epoch=run.records_done_epoch,
                                  records_done_total=run.records_done_total,
                                  seconds_per_record=run.seconds_per_record,
                                  stolen_leases=run.stolen_leases,
                                  backup_leases=run.backup_leases)
            ds.spec.CopyFrom(spec_to_proto(run.spec))
            back = {}   # (shard, offset the rest was issued from) -> holder's last report
            if for_checkpoint:
                back = {(shard, stolen_at): reported for (d, _), (shard, reported, stolen_at)
                        in self._unconfirmed_steals.items() if d == name}
            for shard_id, offset in run.requeue:
                ds.requeued.add(shard_id=shard_id, offset=back.get((shard_id, offset), offset),
                                failures=run.failures.get(shard_id, 0))
            for lease in run.doing.values():
                holder = self._tasks[lease.task_key]
                offset = lease.offset
                if not lease.applied:
                    offset = back.get((lease.shard_id, offset), offset)
                ds.doing.add(shard_id=lease.shard_id, offset=offset, applied=lease.applied,
                             lease_seconds=lease.lease_seconds,
                             failures=run.failures.get(lease.shard_id, 0), lease_id=lease.lease_id,
                             holder=pb.TaskId(type=holder.type, index=holder.index,
                                              incarnation=lease.incarnation),
                             backup_of=lease.backup_of if lease.partner else 0,
                             sparse_reports=lease.sparse, held=lease.held)
            for shard_id, offset in run.poisoned.items():
                ds.poisoned.add(shard_id=shard_id, offset=offset,
                                failures=run.failures.get(shard_id, 0))
            listed = set(run.poisoned) | {s for s, _ in run.requeue} | {
                le.shard_id for le in run.doing.values()}
            for shard_id, count in run.failures.items():
                if shard_id not in listed:
                    ds.failure_counts.add(shard_id=shard_id, failures=count)
        if with_tasks:
            for t in self._tasks.values():
                out.tasks.add(task=t.task_id(), dead=t.dead, shards_done=t.shards_done,
                              records_done=t.records_done, failures=t.failures,
                              seconds_per_record=t.seconds_per_record,
                              recent_done_leases=list(t.recent_done))
        return out

    def load(self, state: pb.ShardingState) -> None:
        """Replaces everything with a snapshot written by :meth:`snapshot` (master restart):
        leases stay with their holders, who may still report them."""
        try:
            self._check_state(state, keep_doing=True)
        except (InvalidRequest, IncompatibleState) as e:
            raise CorruptState(f"state snapshot is inconsistent: {e}") from e
        self._runs.clear()
        self._tasks.clear()
        self._deadlines.clear()
        self._unconfirmed_steals.clear()
        for ts in state.tasks:
            t = _Task(ts.task)
            t.dead, t.shards_done, t.records_done = ts.dead, ts.shards_done, ts.records_done
            t.failures, t.seconds_per_record = ts.failures, ts.seconds_per_record
            t.recent_done.extend(ts.recent_done_leases)
            self._tasks[t.key] = t
        now = self._now()
        for ds in state.datasets:
            self._runs[ds.spec.name] = self._run_from_state(ds, keep_doing=True, now=now)
        self._next_lease_id = max(self._next_lease_id, state.next_lease_id)

    def grant_grace(self) -> None:
        """After a master restart: every lease gets a full new term, counted from now,
        so holders that kept working while the master was down can still report."""
        now = self._now()
        self._deadlines.clear()
        for name, run in self._runs.items():
            for lease in run.doing.values():
                lease.deadline = now + lease.lease_seconds
                heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id, name))

    # ------------------------------------------------------------------ events

    def apply(self, entry: pb.JournalEntry):
        """Applies one validated event. Also the replay path of a restarted master."""
        kind = entry.WhichOneof("event")
        if kind == "register":
            spec = spec_from_proto(entry.register)
            self._runs[spec.name] = _Run(spec)
            return None
        if kind == "task_joined":
            return self._apply_task_joined(entry.task_joined, entry.time)
        if kind == "issue":
            lease = self._apply_issue(entry.issue, entry.time)
            run = self._runs[entry.issue.dataset]
            run.started_unix = run.started_unix or entry.time
            return lease
        if kind == "settle":
            result = self._apply_settle(entry.settle, entry.time)
            run = self._runs[entry.settle.dataset]
            if run.finished and not run.finished_unix:
                run.finished_unix = entry.time
            return result
        if kind == "task_failed":
            t = self._tasks[f"{entry.task_failed.type}:{entry.task_failed.index}"]
            if entry.task_failed.incarnation > t.incarnation:
                self._apply_task_joined(entry.task_failed, entry.time)
            self._release_all(t, entry.time)
            t.dead = True
            return None
        if kind == "restore":
            return self._apply_restore(entry.restore, entry.time)
        raise CorruptState(f"journal entry without a known event: {entry}")

    def _apply_task_joined(self, task: pb.TaskId, now: float):
        key = f"{task.type}:{task.index}"
        t = self._tasks.get(key)
        if t is None:
            t = self._tasks[key] = _Task(task)
        else:
            self._release_all(t, now)  # the old incarnation is gone
            t.incarnation, t.dead = task.incarnation, False
            t.last_request.clear()
        return t

    def _apply_issue(self, ev: pb.IssueEvent, now: float) -> _Lease:
        run = self._runs[ev.dataset]
        t = self._tasks[f"{ev.task.type}:{ev.task.index}"]
        shard_id, offset = ev.shard_id, ev.offset
        original = None
        if ev.backup_of:   # a duplicate: the shard stays where it is (DOING)
            original = run.doing.get(ev.backup_of)
            if (original is None or original.pair is not None or original.shard_id != shard_id
                    or offset != original.offset + original.applied):
                raise CorruptState(f"backup of lease {ev.backup_of} (shard {shard_id}@{offset}),"
                                   " which is not an unpaired DOING lease at that offset")
        elif run.spec.static_workers:
            try:
                run.requeue.remove((shard_id, offset))
            except ValueError:
                raise CorruptState(f"issue of shard {shard_id}@{offset}, which is not TODO"
                                   ) from None
        elif run.requeue:
            if run.requeue[0] != (shard_id, offset):
                raise CorruptState(f"issue of shard {shard_id}@{offset} but the next TODO is "
                                   f"{run.requeue[0]}")
            run.requeue.popleft()
        elif offset or run.cursor >= run.plan.num_shards:
            raise CorruptState(f"issue of shard {shard_id}@{offset} with nothing left to issue")
        else:
            run.cursor += 1  # ev.shard_id is order(cursor); recomputing it is the costly part
        lease = _Lease(ev.lease_id, ev.dataset, shard_id, run.epoch, offset,
                       run.plan.shard_length(shard_id) - offset, t.key, ev.task.incarnation, now,
                       ev.lease_seconds, run.failures.get(shard_id, 0))
        lease.sparse = ev.sparse_reports
        run.doing[lease.lease_id] = lease
        t.leases.add(lease.lease_id)
        if original is not None:
            self._link(original, lease)
            run.backup_leases += 1
        if ev.request_id:
            t.last_request[ev.dataset] = (ev.request_id, lease.lease_id)
        self._next_lease_id = max(self._next_lease_id, ev.lease_id + 1)
        heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id, ev.dataset))
        return lease

    def _apply_settle(self, ev: pb.SettleEvent, now: float):
        run = self._runs[ev.dataset]
        lease = run.doing[ev.lease_id]
        t = self._tasks[lease.task_key]
        if ev.kind == _S_PROGRESS:
            delta = ev.records_processed - lease.applied
            if not lease.sparse:   # a sparse report spans many batches
                if delta > 0:
                    t.batch_records = delta
                lease.last_delta = max(lease.last_delta, delta)
            self._count_applied(run, t, lease, ev.records_processed)
            lease.lease_seconds = ev.lease_seconds
            lease.deadline = now + ev.lease_seconds
            heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id, ev.dataset))
            return lease
        if ev.kind == _S_HELD:
            self._hold(lease, now)
            t.failures += 1
            return lease
        del run.doing[lease.lease_id]
        t.leases.discard(lease.lease_id)
        partner = run.doing.get(lease.partner) if lease.partner else None
        if ev.kind == _S_DONE:
            self._count_applied(run, t, lease, lease.length)
            spr = (now - lease.issued_at) / max(1, lease.length)
            t.seconds_per_record = _ewma(t.seconds_per_record, spr, 0.3)
            run.seconds_per_record = _ewma(run.seconds_per_record, spr, 0.1)
            t.shards_done += 1
            t.recent_done.append(lease.lease_id)
            run.failures.pop(lease.shard_id, None)
            if partner is not None:
                # first finisher wins: the partner's next report is refused (it applies
                # the batch it is training now: a duplicate, like what both trained)
                self._drop(partner)
        elif partner is not None:
            # FAILED or EXPIRED with the duplicate still running: it covers the rest
            self._count_applied(run, t, lease, ev.records_processed)
            self._drop(lease, keep=partner)
            t.failures += 1
        elif ev.kind == _S_STOLEN:
            # the holder applies the batch it is training now (one batch after its last
            # report) and learns from its next report that the rest is no longer its own
            self._count_applied(run, t, lease, ev.records_processed)
            self._give_back(run, lease, count_failure=False)
            run.stolen_leases += 1
        else:  # FAILED or EXPIRED; a held lease: RELEASED, or EXPIRED (settle timeout)
            self._count_applied(run, t, lease, ev.records_processed)
            self._give_back(run, lease, count_failure=True)
            if not lease.held:   # a held lease's failure was counted when it was held
                t.failures += 1
        self._maybe_next_epoch(run)
        return lease

    def _steal_candidate(self, run: _Run, thief: _Task,
                         unpaired: bool = False) -> tuple[Optional[_Lease], int]:
        """The lease whose rest the idle ``thief`` would finish soonest relative to its
        holder, and the records the holder may be training in it now (one batch after its
        last report: a worker trains and reports one batch at a time). A lease not reported
        on yet is not stolen (it may be prefetched behind another lease, so the holder may
        not reach its first batch before the job ends: that batch, counted as in flight,
        was lost — seen in CI); a backup of it counts the holder's batch size from its
        other leases as in flight. At least two batches must be left after that,
        and the holder must need 1.5 times longer than the thief. The holder's speed is its
        pace on this lease once it reported on it (a worker that slowed down mid-lease, or
        has not finished a lease yet, is judged by what it does now), else its past pace.
        ``unpaired``: backup leases: only leases without a duplicate yet."""
        best, best_gain, best_in_flight = None, 0.0, 0
        now = self._now()
        thief_spr = thief.seconds_per_record or run.seconds_per_record
        for lease in run.doing.values():
            if (lease.task_key == thief.key or lease.sparse or lease.held
                    or (unpaired and lease.pair is not None)):
                continue
            holder = self._tasks[lease.task_key]
            if not lease.applied and not unpaired:
                continue
            in_flight = lease.last_delta or (holder.batch_records if not lease.applied else 0)
            if in_flight <= 0:
                continue
            rest = lease.length - lease.applied - in_flight
            if rest < _STEAL_MIN_BATCHES * in_flight:
                continue
            if lease.applied and now > lease.issued_at:
                holder_spr = (now - lease.issued_at) / lease.applied
            else:
                holder_spr = holder.seconds_per_record or run.seconds_per_record
            if thief_spr <= 0 or holder_spr < _STEAL_SPEEDUP * thief_spr:
                continue
            gain = rest * (holder_spr - thief_spr)
            if gain > best_gain:
                best, best_gain, best_in_flight = lease, gain, in_flight
        return best, best_in_flight

    def _count_applied(self, run: _Run, t: _Task, lease: _Lease, applied: int) -> None:
        """Counts the records trained since the last report exactly once (a lease and its
        duplicate: by how far the two together reach)."""
        if lease.pair is None:
            delta = applied - lease.applied
        else:
            end = max(lease.pair.end, lease.offset + applied)
            delta, lease.pair.end = end - lease.pair.end, end
        lease.applied = applied
        run.records_done_epoch += delta
        run.records_done_total += delta
        t.records_done += delta

    def _give_back(self, run: _Run, lease: _Lease, count_failure: bool) -> None:
        # (the survivor of a lease and its duplicate: from as far as both got)
        offset = lease.pair.end if lease.pair is not None else lease.offset + lease.applied
        if offset >= run.plan.shard_length(lease.shard_id):
            return  # every record was trained: the shard is DONE
        if count_failure:
            failures = run.failures[lease.shard_id] = run.failures.get(lease.shard_id, 0) + 1
            if failures >= self.config.max_failures:
                run.poisoned[lease.shard_id] = offset
                return
        if run.spec.static_workers:   # every TODO is queued already: the remainder first
            run.requeue.appendleft((lease.shard_id, offset))
        else:
            run.requeue.append((lease.shard_id, offset))

    @staticmethod
    def _link(original: _Lease, backup: _Lease) -> None:
        original.pair = backup.pair = _Pair(max(original.offset + original.applied,
                                                backup.offset + backup.applied))
        original.partner, backup.partner = backup.lease_id, original.lease_id
        backup.backup_of = original.lease_id

    def _drop(self, lease: _Lease, keep: Optional[_Lease] = None) -> None:
        """A paired lease ends without giving anything back (its partner covers the
        rest, or finished the shard); ``keep``, the partner, goes on alone."""
        run = self._runs[lease.dataset]
        run.doing.pop(lease.lease_id, None)
        self._tasks[lease.task_key].leases.discard(lease.lease_id)
        if keep is not None:
            keep.partner = 0

    def _hold(self, lease: _Lease, now: float) -> None:
        lease.held = True
        self._tasks[lease.task_key].leases.discard(lease.lease_id)
        lease.deadline = now + self.config.settle_seconds
        heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id, lease.dataset))

    def _wants_dense(self, run: _Run, t: _Task) -> bool:
        """Whether a lease for ``t`` must be reported after every batch even though its
        trainer could report sparsely: only a lease reported per batch can be stolen or
        backed up (the master must know where its holder is), and those are the tail of
        an epoch and the leases of slow holders — or of holders whose pace is not known
        yet (a worker slowed from the start holds its first lease longest)."""
        if not (run.spec.tail_stealing or run.spec.backup_leases):
            return False
        if t.seconds_per_record <= 0 or run.seconds_per_record <= 0:
            return True
        live = sum(1 for x in self._tasks.values() if x.type == t.type and not x.dead)
        if run.todo_shards() <= _DENSE_TAIL_SHARDS_PER_WORKER * max(1, live):
            return True
        return t.seconds_per_record > _DENSE_SLOWNESS * run.seconds_per_record

    def _release_all(self, t: _Task, now: float) -> None:
        for lease_id in sorted(t.leases):
            for run in self._runs.values():
                lease = run.doing.get(lease_id)
                if lease is not None:
                    partner = run.doing.get(lease.partner) if lease.partner else None
                    if lease.sparse and partner is None:
                        # how far it got is on the PS: held for the trainer to settle
                        self._hold(lease, now)
                    elif partner is not None:
                        self._drop(lease, keep=partner)
                    else:
                        del run.doing[lease_id]
                        self._give_back(run, lease, count_failure=True)
                    t.failures += 1
                    self._maybe_next_epoch(run)
                    break
        t.leases.clear()

    def _maybe_next_epoch(self, run: _Run) -> None:
        if (run.finished or run.cursor < run.plan.num_shards or run.requeue or run.doing):
            return
        run.epoch += 1
        if run.finished:
            return  # keep the last epoch's counts and poisoned shards for the report
        run.cursor = 0
        run.records_done_epoch = 0
        run.failures.clear()
        run.poisoned.clear()
        run.order = run.plan.order(run.epoch)
        run.start_epoch()

    def _apply_restore(self, state: pb.ShardingState, now: float):
        self._unconfirmed_steals.clear()
        # Leases finished after the snapshot are undone: a repeated DONE for one of them
        # must not be answered DUPLICATE (as if it still counted).
        for t in self._tasks.values():
            t.recent_done.clear()
        for ds in state.datasets:
            old = self._runs.get(ds.spec.name)
            if old is not None:
                for lease in old.doing.values():
                    self._tasks[lease.task_key].leases.discard(lease.lease_id)
            run = self._runs[ds.spec.name] = self._run_from_state(ds, keep_doing=False, now=now)
            if old is not None:   # the job started when it started, restores or not
                run.started_unix = old.started_unix
        self._next_lease_id = max(self._next_lease_id, state.next_lease_id)

    def _run_from_state(self, ds: pb.DatasetState, keep_doing: bool, now: float) -> _Run:
        run = _Run(spec_from_proto(ds.spec))
        run.requeue.clear()   # (static sharding filled it for epoch 0) the snapshot says
        run.epoch, run.cursor = ds.epoch, ds.cursor
        if not run.finished:
            run.order = run.plan.order(run.epoch)
        run.records_done_epoch = ds.records_done_epoch
        run.stolen_leases = ds.stolen_leases
        run.backup_leases = ds.backup_leases
        run.records_done_total = ds.records_done_total
        run.seconds_per_record = ds.seconds_per_record
        for r in list(ds.requeued) + list(ds.doing) + list(ds.poisoned) + list(ds.failure_counts):
            if r.failures:
                run.failures[r.shard_id] = r.failures
        run.requeue.extend((r.shard_id, r.offset) for r in ds.requeued)
        # a lease and its duplicate: the shard is TODO once, from as far as both got
        reach: dict[int, int] = {}
        for r in ds.doing:
            reach[r.shard_id] = max(reach.get(r.shard_id, 0), r.offset + r.applied)
        for r in ds.doing:
            if keep_doing:
                t = self._tasks[f"{r.holder.type}:{r.holder.index}"]
                length = run.plan.shard_length(r.shard_id) - r.offset
                lease = _Lease(r.lease_id, run.spec.name, r.shard_id, run.epoch, r.offset, length,
                               t.key, r.holder.incarnation, now,
                               r.lease_seconds or self.config.initial_seconds, r.failures)
                lease.applied = r.applied
                lease.sparse, lease.held = r.sparse_reports, r.held
                run.doing[lease.lease_id] = lease
                if not lease.held:
                    t.leases.add(lease.lease_id)
                heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id, run.spec.name))
            elif r.backup_of:
                continue
            elif reach[r.shard_id] < run.plan.shard_length(r.shard_id):
                run.requeue.append((r.shard_id, reach[r.shard_id]))
            # else: every record was trained before the snapshot; the shard is DONE
        if keep_doing:
            for r in ds.doing:
                if r.backup_of:
                    self._link(run.doing[r.backup_of], run.doing[r.lease_id])
        run.poisoned.update((r.shard_id, r.offset) for r in ds.poisoned)
        self._maybe_next_epoch(run)  # a DOING shard may have been fully trained already
        return run

    def _check_state(self, state: pb.ShardingState, keep_doing: bool) -> None:
        """Validates an untrusted snapshot completely before anything is applied."""
        if state.format_version != STATE_FORMAT_VERSION:
            raise IncompatibleState(
                f"sharding state format version {state.format_version} is not supported "
                f"(this master reads version {STATE_FORMAT_VERSION})")
        if not 0 <= state.next_lease_id <= limits.MAX_LEASE_ID:
            raise InvalidRequest(f"next_lease_id must be in [0, {limits.MAX_LEASE_ID}], got "
                                 f"{state.next_lease_id}")
        if len(state.datasets) > limits.MAX_DATASETS:
            raise InvalidRequest(f"the state holds {len(state.datasets)} datasets, at most "
                                 f"{limits.MAX_DATASETS} allowed")
        if keep_doing:
            if len(state.tasks) > limits.MAX_TASKS:
                raise InvalidRequest(f"the state holds {len(state.tasks)} tasks, at most "
                                     f"{limits.MAX_TASKS} allowed")
            for ts in state.tasks:
                validate_task(ts.task)
                _finite(ts.seconds_per_record, "a task's seconds_per_record")
                for value in (ts.shards_done, ts.records_done, ts.failures):
                    _counter(value, "a task's counters")
        names = set()
        for ds in state.datasets:
            spec = spec_from_proto(ds.spec)  # raises InvalidRequest
            if spec.name in names:
                raise InvalidRequest(f"dataset {spec.name!r} appears twice in the state")
            names.add(spec.name)
            plan = ShardPlan(spec)
            where = f"state of dataset {spec.name!r}"
            if not 0 <= ds.epoch <= spec.num_epochs:
                raise InvalidRequest(f"{where}: epoch {ds.epoch} not in [0, {spec.num_epochs}]")
            if not 0 <= ds.cursor <= plan.num_shards:
                raise InvalidRequest(f"{where}: cursor {ds.cursor} not in [0, {plan.num_shards}]")
            if not 0 <= ds.records_done_epoch <= plan.num_records or ds.records_done_total < 0:
                raise InvalidRequest(f"{where}: record counts out of range")
            _counter(ds.records_done_total, f"{where}: records_done_total")
            _counter(ds.stolen_leases, f"{where}: stolen_leases")
            _counter(ds.backup_leases, f"{where}: backup_leases")
            _finite(ds.seconds_per_record, f"{where}: seconds_per_record")
            order = plan.order(min(ds.epoch, spec.num_epochs - 1))
            seen: set[int] = set()
            lease_ids = [r.lease_id for r in ds.doing]
            if keep_doing and (len(set(lease_ids)) != len(lease_ids) or min(lease_ids, default=1) < 1
                               or max(lease_ids, default=0) >= state.next_lease_id):
                raise InvalidRequest(f"{where}: lease ids of DOING shards are not unique "
                                     "and below next_lease_id")
            doing_by_id = {r.lease_id: r for r in ds.doing}
            for r in ds.doing:
                if r.held and (not r.sparse_reports or r.backup_of):
                    raise InvalidRequest(f"{where}: lease {r.lease_id} is held but not a "
                                         "lease with sparse reports")
                if r.backup_of:
                    orig = doing_by_id.get(r.backup_of)
                    if (orig is None or orig.backup_of or orig.shard_id != r.shard_id
                            or orig is r or not spec.backup_leases or sum(
                                o.backup_of == r.backup_of for o in ds.doing) != 1):
                        raise InvalidRequest(f"{where}: lease {r.lease_id} duplicates lease "
                                             f"{r.backup_of}, which is not a DOING lease of "
                                             "its shard without another duplicate")
            groups = (("requeued", ds.requeued), ("doing", ds.doing), ("poisoned", ds.poisoned),
                      ("failure_counts", ds.failure_counts))
            for group, items in groups:
                for r in items:
                    if not 0 <= r.shard_id < plan.num_shards:
                        raise InvalidRequest(f"{where}: {group} shard {r.shard_id} out of range")
                    if group == "doing" and r.backup_of:
                        pass      # its original lists the shard (checked above)
                    elif r.shard_id in seen:
                        raise InvalidRequest(f"{where}: shard {r.shard_id} is listed twice")
                    seen.add(r.shard_id)
                    if group != "failure_counts" and not (
                            0 <= r.offset < plan.shard_length(r.shard_id)):
                        raise InvalidRequest(f"{where}: shard {r.shard_id} offset {r.offset} "
                                             "out of range")
                    if not 0 <= r.applied <= plan.shard_length(r.shard_id) - r.offset or (
                            r.applied and group != "doing"):
                        raise InvalidRequest(f"{where}: shard {r.shard_id} applied count "
                                             f"{r.applied} out of range")
                    if order.inverse(r.shard_id) >= ds.cursor:
                        raise InvalidRequest(f"{where}: shard {r.shard_id} is listed but was "
                                             "never issued (beyond the cursor)")
                    if r.failures < 0:
                        raise InvalidRequest(f"{where}: negative failure count")
                    _finite(r.lease_seconds, f"{where}: lease_seconds")
                    if group == "doing" and keep_doing:
                        validate_task(r.holder)
                        if not any(ts.task.type == r.holder.type and ts.task.index == r.holder.index
                                   for ts in state.tasks):
                            raise InvalidRequest(f"{where}: lease {r.lease_id} holder "
                                                 f"{task_name(r.holder)} is not in the task table")

    def _check_dataset_room(self, specs: list) -> None:
        """Refuses datasets beyond :data:`limits.MAX_DATASETS` or specs beyond the byte
        budgets (a snapshot must stay far below a gRPC message's 4 MiB)."""
        new = {s.name: s for s in specs}
        names = set(self._runs) | set(new)
        if len(names) > limits.MAX_DATASETS:
            raise InvalidRequest(f"at most {limits.MAX_DATASETS} datasets can be registered "
                                 f"with one master; {len(self._runs)} are")
        sizes = {name: run.spec_bytes for name, run in self._runs.items()}
        for name, spec in new.items():
            sizes[name] = spec.ByteSize()
            if sizes[name] > limits.MAX_SPEC_BYTES:
                raise InvalidRequest(f"dataset {shown(name)}: its spec takes {sizes[name]} "
                                     f"bytes, at most {limits.MAX_SPEC_BYTES} allowed")
        if sum(sizes.values()) > limits.MAX_TOTAL_SPEC_BYTES:
            raise InvalidRequest(f"the registered datasets' specs would take "
                                 f"{sum(sizes.values())} bytes, at most "
                                 f"{limits.MAX_TOTAL_SPEC_BYTES} allowed")

    # ----------------------------------------------------------------- helpers

    def _shard_msg(self, run: _Run, lease: _Lease) -> pb.Shard:
        g = run.plan.geometry(lease.shard_id)
        return pb.Shard(dataset=run.spec.name, shard_id=lease.shard_id, epoch=lease.epoch,
                        lease_id=lease.lease_id, start=g.start + lease.offset, length=lease.length,
                        file=g.file, file_start=g.file_start + lease.offset, shard_start=g.start,
                        shard_length=g.length, attempt=lease.attempt,
                        lease_seconds=lease.lease_seconds, sparse_reports=lease.sparse)

    def _lease_seconds(self, run: _Run, t: _Task, records: int) -> float:
        spr = max(t.seconds_per_record, run.seconds_per_record)
        if spr <= 0:
            return self.config.initial_seconds
        expected = self.config.factor * spr * max(1, records)
        return min(self.config.max_seconds, max(self.config.min_seconds, expected))

    def _retry_after(self, run: _Run) -> float:
        expected = run.seconds_per_record * run.spec.records_per_shard
        return min(1.0, max(0.05, expected / 4))


def _describe_spec_diff(old: DatasetSpec, new: DatasetSpec) -> str:
    diffs = []
    for field in dataclasses.fields(DatasetSpec):
        a, b = getattr(old, field.name), getattr(new, field.name)
        if a != b:
            if field.name == "files":
                a, b = f"{len(a)} files", f"{len(b)} files"
            diffs.append(f"{field.name}: registered {a!r}, now {b!r}")
    return "; ".join(diffs)
