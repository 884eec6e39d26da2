"""Stateful dynamic data sharding: the master's shard ledger and its gRPC service.

Purpose: trainers *pull* small shards (record ranges) from the master, so fast workers
train more of the data and slow ones less, and every record of an epoch is trained
exactly once even when tasks, or the master itself, die.

Guarantees:
  - Exactly-once accounting: a shard (or the unfinished remainder of one) is leased to
    one task incarnation at a time; DONE counts its records once; a repeated DONE answers
    DUPLICATE; a DONE for a lease that was taken away is refused (FAILED_PRECONDITION)
    and counts nothing.
  - Leases come back to TODO (ahead of never-issued shards, from the last reported
    offset) when the holder reports FAILED, dies, is relaunched, or stops reporting for
    longer than its lease, which scales with observed speed so slow workers keep theirs.
  - Persistence: every event is journaled before it is acknowledged (``StateStore``).
  - Checkpointing with the model: ``SaveState``/``RestoreState`` move a typed, versioned
    snapshot; after a restore every DOING shard is TODO again.
  - Bounded memory: never-issued shards are a cursor into a seeded permutation.

Modules: ``plan`` (geometry, order), ``state`` (the state machine), ``store``
(snapshot + journal), ``service`` (gRPC servicer and server), ``client``.
"""
