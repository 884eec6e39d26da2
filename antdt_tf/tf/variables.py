"""Reading variables that may be split over the PS tasks."""

from __future__ import annotations

import tensorflow as tf


def full_value(variable) -> tf.Tensor:
    """The whole value of a plain or sharded (``ShardedVariable``) variable, read to
    where this runs (the coordinator)."""
    parts = getattr(variable, "variables", None)
    return tf.concat([p.read_value() for p in parts], 0) if parts else variable.read_value()
