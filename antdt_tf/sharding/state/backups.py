"""Backup leases, a part of :class:`~.ledger.ShardState`: a speculative duplicate of a
slow lease starts where the original's last report left it; the two share a
:class:`~.records.Pair` and the first to finish the shard wins."""

from __future__ import annotations

from typing import Optional

from antdt_tf.sharding.state.records import Lease, Pair


class BackupPairs:
    """Linking a lease and its duplicate, and ending one of them."""

    @staticmethod
    def _link(original: Lease, backup: Lease) -> None:
        original.pair = backup.pair = Pair(max(original.offset + original.applied,
                                                backup.offset + backup.applied))
        original.partner, backup.partner = backup.lease_id, original.lease_id
        backup.backup_of = original.lease_id

    def _drop(self, lease: Lease, keep: Optional[Lease] = None) -> None:
        """A paired lease ends without giving anything back (its partner covers the
        rest, or finished the shard); ``keep``, the partner, goes on alone."""
        run = self._runs[lease.dataset]
        run.doing.pop(lease.lease_id, None)
        self._tasks[lease.task_key].leases.discard(lease.lease_id)
        if keep is not None:
            keep.partner = 0
