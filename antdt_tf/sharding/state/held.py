"""Held leases and expiry, a part of :class:`~.ledger.ShardState`.

A lease with sparse reports is reported per lease, not per batch: its exact offset is
on the PS. When its holder dies or goes silent the lease is *held* — kept from re-issue
— until the trainer settles it from the PS record (``apply_record``) or the settle
timeout passes (then it goes back from the master's own count). Deadlines are soft
state: a restarted master grants every lease a new term."""

from __future__ import annotations

import heapq

from antdt_tf.errors import InvalidRequest
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.state.records import (S_DONE, S_EXPIRED, S_HELD, S_PROGRESS, S_RELEASED,
                                             Lease, TaskRecord, validate_task)


class HeldLeases:
    """Settling held leases from the PS record, renewing and expiring deadlines."""

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
            kind, lease_seconds = S_RELEASED, 0.0
        elif applied == lease.length:
            kind, lease_seconds = S_DONE, 0.0
        elif applied > lease.applied:
            kind = S_PROGRESS
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
            kind = S_HELD if lease.sparse and not lease.held else S_EXPIRED
            self._commit(pb.JournalEntry(time=now, settle=pb.SettleEvent(
                dataset=dataset, lease_id=lease_id, kind=kind,
                records_processed=lease.applied)))
            expired += 1
        return expired

    def grant_grace(self) -> None:
        """After a master restart: every lease gets a full new term, counted from now,
        so holders that kept working while the master was down can still report."""
        now = self._now()
        self._deadlines.clear()
        for name, run in self._runs.items():
            for lease in run.doing.values():
                lease.deadline = now + lease.lease_seconds
                heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id, name))

    def _hold(self, lease: Lease, now: float) -> None:
        lease.held = True
        self._tasks[lease.task_key].leases.discard(lease.lease_id)
        lease.deadline = now + self.config.settle_seconds
        heapq.heappush(self._deadlines, (lease.deadline, lease.lease_id, lease.dataset))

    def _release_all(self, t: TaskRecord, now: float) -> None:
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
