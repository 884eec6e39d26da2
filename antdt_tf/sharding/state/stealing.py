"""Tail stealing and the dense-report rule, a part of :class:`~.ledger.ShardState`.

An idle task may take over the rest of a slow holder's lease (it pays when the holder
would need much longer for the rest); only a lease reported per batch can be taken
over, so a trainer that could report sparsely is asked to report per batch where a
steal or a backup may be wanted."""

from __future__ import annotations

from typing import Optional

from antdt_tf.sharding.state.records import Lease, Run, TaskRecord

# take over a lease only when its holder would need this many times longer for the
# rest than the idle task, and at least two batches are left after the one the
# holder is training now
_STEAL_SPEEDUP = 1.5
_STEAL_MIN_BATCHES = 2
# sparse reports: a lease is reported after every batch anyway (so that it can be
# stolen or backed up) when few shards are left to issue (this many per live worker) or
# its holder is this much slower than the dataset's pace — the Monitor's own "slow"
# (``monitor.straggler.StragglerConfig.slow_ratio``). At 1.25 the noise of a shared machine's paces made
# holders that were not slow report per batch: 40-60 % of a TF1 worker's steps in a job
# without a straggler, each a Python RPC to the master.
_DENSE_TAIL_SHARDS_PER_WORKER = 2
_DENSE_SLOWNESS = 1.5


class TailStealing:
    """Which lease an idle task may take over, and which leases must be reported per batch."""

    def _steal_candidate(self, run: Run, thief: TaskRecord,
                         unpaired: bool = False) -> tuple[Optional[Lease], int]:
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

    def _wants_dense(self, run: Run, t: TaskRecord) -> bool:
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
