"""Snapshots, a part of :class:`~.ledger.ShardState`: the whole state as a
``ShardingState`` message (checkpoints, the store's snapshot), loading one back (master
restart: leases stay with their holders) and rolling datasets back to one (a restore:
leases are re-issued). An untrusted snapshot is validated completely before anything
is applied."""

from __future__ import annotations

import heapq
from typing import Iterable

from antdt_tf import limits
from antdt_tf.errors import CorruptState, IncompatibleState, InvalidRequest, shown
from antdt_tf.proto import sharding_pb2 as pb
from antdt_tf.sharding.plan import ShardPlan
from antdt_tf.sharding.state.records import (STATE_FORMAT_VERSION, Lease, Run, TaskRecord,
                                             check_counter, check_finite, describe_spec_diff,
                                             spec_from_proto, spec_to_proto, task_name,
                                             validate_task)


class Snapshots:
    """Snapshot, load and restore, with the validation of a snapshot."""

    def restore_state(self, state: pb.ShardingState) -> tuple[list[str], int]:
        """Rolls the datasets in ``state`` back to it (see RestoreStateRequest)."""
        self._check_state(state, keep_doing=False)
        for ds in state.datasets:
            run = self._runs.get(ds.spec.name)
            if run is not None and run.spec != spec_from_proto(ds.spec):
                raise IncompatibleState(
                    f"dataset {ds.spec.name!r}: the snapshot was taken with different parameters "
                    f"({describe_spec_diff(run.spec, spec_from_proto(ds.spec))})")
        self._check_dataset_room([ds.spec for ds in state.datasets])
        self._commit(pb.JournalEntry(time=self._now(), restore=state))
        return ([ds.spec.name for ds in state.datasets],
                sum(len(ds.doing) for ds in state.datasets))

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
            t = TaskRecord(ts.task)
            t.dead, t.shards_done, t.records_done = ts.dead, ts.shards_done, ts.records_done
            t.failures, t.seconds_per_record = ts.failures, ts.seconds_per_record
            t.recent_done.extend(ts.recent_done_leases)
            self._tasks[t.key] = t
        now = self._now()
        for ds in state.datasets:
            self._runs[ds.spec.name] = self._run_from_state(ds, keep_doing=True, now=now)
        self._next_lease_id = max(self._next_lease_id, state.next_lease_id)

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

    def _run_from_state(self, ds: pb.DatasetState, keep_doing: bool, now: float) -> Run:
        run = Run(spec_from_proto(ds.spec))
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
                lease = Lease(r.lease_id, run.spec.name, r.shard_id, run.epoch, r.offset, length,
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
                check_finite(ts.seconds_per_record, "a task's seconds_per_record")
                for value in (ts.shards_done, ts.records_done, ts.failures):
                    check_counter(value, "a task's counters")
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
            check_counter(ds.records_done_total, f"{where}: records_done_total")
            check_counter(ds.stolen_leases, f"{where}: stolen_leases")
            check_counter(ds.backup_leases, f"{where}: backup_leases")
            check_finite(ds.seconds_per_record, f"{where}: seconds_per_record")
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
                    check_finite(r.lease_seconds, f"{where}: lease_seconds")
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
