"""ShardState: the master's record of every shard of every registered dataset.

Lifecycle of a shard within one epoch::

    TODO  --GetShard-->  DOING (a lease held by one task incarnation)
    DOING --DONE------>  DONE
    DOING --FAILED / lease expired / holder died / holder relaunched-->
          TODO again, from the holder's last applied offset, ahead of never-issued shards
          (or POISONED once the shard failed ``max_failures`` times: the job goes on)
    all shards DONE or POISONED --> next epoch (a new seeded order) ... after the last: END

Invariants (every part of the class keeps them):

* Bounded memory for huge datasets: never-issued shards are implied by a cursor into
  the epoch's permutation; only shards that were issued and are not DONE (``requeue``,
  ``doing``, ``poisoned``) are stored. DONE = issued minus those, so no shard can be
  counted DONE twice by construction.
* Records are counted once: a report counts what it adds beyond the lease's last count;
  a lease and its backup count by how far the two together reach.
* Every change is an *event* (a ``JournalEntry`` proto): a public method validates the
  request, builds the event, hands it to the ``journal`` callback (the persistent store)
  and only then applies it. Replaying the journal through :meth:`ShardState.apply`
  rebuilds exactly the state that was acknowledged. Bad requests raise a typed
  :mod:`antdt_tf.errors` exception before any event exists, so they never change state.
* Soft state (deadlines, unconfirmed steals) is not journaled; a restarted master
  grants every lease a new term.

The class is one state machine in parts, each a module: this one (leases, reports,
epochs, the events), :mod:`.stealing` (tail stealing, the dense-report rule),
:mod:`.backups` (backup pairs), :mod:`.held` (held leases, expiry) and :mod:`.snapshot`
(snapshot, load, restore); the records are in :mod:`.records`.
"""

from __future__ import annotations

import heapq
import time
from typing import Callable, Optional

from antdt_tf import limits
from antdt_tf.errors import (CorruptState, DatasetConflict, InvalidRequest, LeaseNotHeld,
                             StaleIncarnation, UnknownDataset, UnknownTask, shown)
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.plan import DatasetSpec
from antdt_tf.sharding.state.backups import BackupPairs
from antdt_tf.sharding.state.held import HeldLeases
from antdt_tf.sharding.state.records import (
    ACCEPTED, DONE, DUPLICATE, END, FAILED, MAX_POISONED_IDS, PROGRESS, S_DONE, S_HELD,
    S_PROGRESS, S_RELEASED, S_STOLEN, SETTLE_OF, SHARD, WAIT, LeaseConfig, Lease, Run,
    TaskRecord, check_incarnation, describe_spec_diff, ewma, names_for_error,
    spec_from_proto, spec_to_proto, task_name, validate_task)
from antdt_tf.sharding.state.snapshot import Snapshots
from antdt_tf.sharding.state.stealing import TailStealing


class ShardState(TailStealing, BackupPairs, HeldLeases, Snapshots):
    """The sharding state machine. Not thread-safe: the service serialises calls."""

    def __init__(self, config: LeaseConfig = LeaseConfig(),
                 journal: Optional[Callable[[pb.JournalEntry], None]] = None,
                 clock: Callable[[], float] = time.time):
        self.config = config
        self._journal = journal
        self._clock = clock
        self._runs: dict[str, Run] = {}
        self._tasks: dict[str, TaskRecord] = {}
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

    @property
    def datasets(self) -> list[str]:
        return list(self._runs)

    def _run(self, dataset: str) -> Run:
        run = self._runs.get(dataset)
        if run is None:
            raise UnknownDataset(f"unknown dataset {shown(dataset)}; registered: "
                                 f"{names_for_error(self._runs)} (call RegisterDataset first)")
        return run

    def _lookup(self, task: pb.TaskId) -> Optional[TaskRecord]:
        t = self._tasks.get(f"{task.type}:{task.index}")
        if t is None:
            validate_task(task)   # never seen: check the id in full (known ids were checked)
        else:
            check_incarnation(task.incarnation)
        return t

    def _check_new_task(self, task: pb.TaskId) -> None:
        if (f"{task.type}:{task.index}" not in self._tasks
                and len(self._tasks) >= limits.MAX_TASKS):
            raise InvalidRequest(f"the master knows {len(self._tasks)} tasks already, at most "
                                 f"{limits.MAX_TASKS}; task {task_name(task)} is refused")

    def _known_task(self, task: pb.TaskId, t: Optional[TaskRecord] = None) -> TaskRecord:
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
                poisoned_shard_ids=sorted(run.poisoned)[:MAX_POISONED_IDS],
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
                    f"({describe_spec_diff(existing.spec, spec)}); use a new name or restart "
                    "the job with a fresh state_dir")
            return False, existing.plan.num_shards, existing.plan.num_records
        self._check_dataset_room([spec_to_proto(spec)])
        self._commit(pb.JournalEntry(time=self._now(), register=spec_to_proto(spec)))
        run = self._runs[spec.name]
        return True, run.plan.num_shards, run.plan.num_records

    def _admit(self, task: pb.TaskId) -> TaskRecord:
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
                    return pb.GetShardResponse(status=SHARD,
                                               shard=self._shard_msg(run, lease))
        if run.finished:
            return pb.GetShardResponse(status=END)
        nxt = run.next_for(task)
        if nxt is None and run.spec.tail_stealing:
            victim, in_flight = self._steal_candidate(run, t)
            if victim is not None:
                reported = victim.offset + victim.applied
                self._commit(pb.JournalEntry(time=self._now(), settle=pb.SettleEvent(
                    dataset=dataset, lease_id=victim.lease_id, kind=S_STOLEN,
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
                return pb.GetShardResponse(status=SHARD, shard=self._shard_msg(run, lease))
        if nxt is None:
            return pb.GetShardResponse(status=WAIT,
                                       retry_after_seconds=self._retry_after(run))
        shard_id, offset = nxt
        remaining = run.plan.shard_length(shard_id) - offset
        entry = pb.JournalEntry(time=self._now(), issue=pb.IssueEvent(
            dataset=dataset, task=task, lease_id=self._next_lease_id,
            lease_seconds=self._lease_seconds(run, t, remaining), request_id=request_id,
            shard_id=shard_id, offset=offset,
            sparse_reports=sparse_ok and not self._wants_dense(run, t)))
        lease = self._commit(entry)
        return pb.GetShardResponse(status=SHARD,
                                   shard=self._shard_msg(run, lease))

    def report_shard(self, req: pb.ReportShardRequest) -> pb.ReportShardResponse:
        run, t = self._report_target(req)
        lease = run.doing.get(req.lease_id)
        if lease is None or lease.task_key != t.key or lease.incarnation != req.task.incarnation:
            if lease is None:   # a holder reporting its batch in flight when it was stolen
                self._unconfirmed_steals.pop((req.dataset, req.lease_id), None)
            if req.outcome == DONE and req.lease_id in t.recent_done:
                resp = pb.ReportShardResponse(result=DUPLICATE)
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
                    dataset=req.dataset, lease_id=lease.lease_id, kind=S_RELEASED,
                    records_processed=max(lease.applied, req.records_processed))))
            raise LeaseNotHeld(
                f"lease {req.lease_id} (dataset {req.dataset}, shard {req.shard_id}) of "
                f"{task_name(req.task)} expired while it was silent; its rest goes back to "
                "TODO from what this report says was applied: drop the shard")
        self._check_report(req, lease)
        kind = SETTLE_OF[req.outcome]
        lease_seconds = 0.0
        if kind == S_PROGRESS:
            lease_seconds = self._lease_seconds(run, t, lease.length - req.records_processed)
        self._commit(pb.JournalEntry(time=self._now(), settle=pb.SettleEvent(
            dataset=req.dataset, lease_id=lease.lease_id, kind=kind,
            records_processed=req.records_processed, lease_seconds=lease_seconds)))
        resp = pb.ReportShardResponse(result=ACCEPTED)
        if req.get_next:
            resp.next.CopyFrom(self.get_shard(req.dataset, req.task, req.next_request_id))
        return resp

    def _report_target(self, req: pb.ReportShardRequest):
        """The dataset run and known task a report is about, its outcome and count checked."""
        run = self._run(req.dataset)
        t = self._known_task(req.task)
        if req.outcome not in (DONE, FAILED, PROGRESS):
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
    def _check_report(req: pb.ReportShardRequest, lease: Lease) -> None:
        if lease.shard_id != req.shard_id or lease.epoch != req.epoch:
            raise InvalidRequest(
                f"lease {lease.lease_id} is for shard {lease.shard_id} epoch {lease.epoch}, the "
                f"report names shard {req.shard_id} epoch {req.epoch}")
        if req.records_processed > lease.length:
            raise InvalidRequest(
                f"records_processed {req.records_processed} exceeds the lease's {lease.length} "
                f"records (shard {lease.shard_id})")
        if req.outcome == DONE and req.records_processed != lease.length:
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

    def apply(self, entry: pb.JournalEntry):
        """Applies one validated event. Also the replay path of a restarted master."""
        kind = entry.WhichOneof("event")
        if kind == "register":
            spec = spec_from_proto(entry.register)
            self._runs[spec.name] = Run(spec)
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
            t = self._tasks[key] = TaskRecord(task)
        else:
            self._release_all(t, now)  # the old incarnation is gone
            t.incarnation, t.dead = task.incarnation, False
            t.last_request.clear()
        return t

    def _apply_issue(self, ev: pb.IssueEvent, now: float) -> Lease:
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
        lease = Lease(ev.lease_id, ev.dataset, shard_id, run.epoch, offset,
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
        if ev.kind == S_PROGRESS:
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
        if ev.kind == S_HELD:
            self._hold(lease, now)
            t.failures += 1
            return lease
        del run.doing[lease.lease_id]
        t.leases.discard(lease.lease_id)
        partner = run.doing.get(lease.partner) if lease.partner else None
        if ev.kind == S_DONE:
            self._count_applied(run, t, lease, lease.length)
            spr = (now - lease.issued_at) / max(1, lease.length)
            t.seconds_per_record = ewma(t.seconds_per_record, spr, 0.3)
            run.seconds_per_record = ewma(run.seconds_per_record, spr, 0.1)
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
        elif ev.kind == S_STOLEN:
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

    def _count_applied(self, run: Run, t: TaskRecord, lease: Lease, applied: int) -> None:
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

    def _give_back(self, run: Run, lease: Lease, count_failure: bool) -> None:
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

    def _maybe_next_epoch(self, run: Run) -> None:
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

    def _shard_msg(self, run: Run, lease: Lease) -> pb.Shard:
        g = run.plan.geometry(lease.shard_id)
        return pb.Shard(dataset=run.spec.name, shard_id=lease.shard_id, epoch=lease.epoch,
                        lease_id=lease.lease_id, start=g.start + lease.offset, length=lease.length,
                        file=g.file, file_start=g.file_start + lease.offset, shard_start=g.start,
                        shard_length=g.length, attempt=lease.attempt,
                        lease_seconds=lease.lease_seconds, sparse_reports=lease.sparse)

    def _lease_seconds(self, run: Run, t: TaskRecord, records: int) -> float:
        spr = max(t.seconds_per_record, run.seconds_per_record)
        if spr <= 0:
            return self.config.initial_seconds
        expected = self.config.factor * spr * max(1, records)
        return min(self.config.max_seconds, max(self.config.min_seconds, expected))

    def _retry_after(self, run: Run) -> float:
        expected = run.seconds_per_record * run.spec.records_per_shard
        return min(1.0, max(0.05, expected / 4))
