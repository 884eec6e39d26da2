"""The sharding ledger (see :mod:`.ledger` for the state machine and its invariants)."""

from antdt_tf.sharding.state.ledger import ShardState
from antdt_tf.sharding.state.records import (STATE_FORMAT_VERSION, LeaseConfig, spec_from_proto,
                                             spec_to_proto, task_name, validate_task)

__all__ = ["STATE_FORMAT_VERSION", "LeaseConfig", "ShardState", "spec_from_proto",
           "spec_to_proto", "task_name", "validate_task"]
