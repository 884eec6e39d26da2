"""The names a TF1 worker's graph shares between the feed and the hooks, in one place.

:mod:`~antdt_tf.estimator.feed` builds the input pipeline and puts what the hooks need
into graph collections; :mod:`~antdt_tf.estimator.hooks` finds it there when the session
starts (``begin``). Both import these names from here, so neither imports the other's
module for a string. Pure Python: no TensorFlow (the feed's package must import under
any TF version).

(Not ``collections.py``: run from this directory, that name would shadow the standard
library's ``collections``.)
"""

# graph collections -----------------------------------------------------------------

# one int64 vector per step (META_FIELDS): the trained batch's lease metadata
META_COLLECTION = "antdt_lease_meta"
META_FIELDS = ("lease", "shard", "epoch", "applied", "records", "incarnation", "sparse",
               "length")
# sparse reports: [the PS lease record variable, this step's update op of it]
RECORD_COLLECTION = "antdt_lease_record"
# [the worker's refused-lease variable]: the report hook writes a refused lease there,
# the pipeline's filter skips that lease's other batches
REFUSED_LEASE_COLLECTION = "antdt_refused_lease"
# the chief's [sharding state variable, its value placeholder, the assign op]
SHARDING_STATE_COLLECTION = "antdt_sharding_state"

# variable names (in checkpoints: renaming one breaks restoring older checkpoints) ----

VARIABLE_SCOPE = "antdt"
LEASE_RECORD_VARIABLE = "lease_record"          # antdt/lease_record, on a PS
SHARDING_STATE_VARIABLE = "sharding_state"      # antdt/sharding_state, on the chief


def refused_lease_variable(worker: int) -> str:
    """The name of worker ``worker``'s refused-lease local variable (not checkpointed;
    per worker, so several feeds can share one graph)."""
    return f"antdt_refused_lease_{worker}"
