"""TF1-style training (``MonitoredTrainingSession``, ``tf.estimator``) on the master's
shards: :class:`ShardFeed` (input function + hooks). TensorFlow is imported when the
feed builds its graph, so this package imports under any TF version the hooks run on.

- ``feed``: :class:`ShardFeed`, the input pipeline; it asks ``assembly`` for its hooks.
- ``graph_keys``: the graph-collection and variable names the feed and hooks share
  (pure Python).
- ``hooks``: the ``SessionRunHook``s and the chief's checkpoint listener; each gets what
  it needs as arguments, none imports the feed.
- ``assembly``: the one place that builds a job's hooks, in order.

Imports point one way: feed -> graph_keys; feed -> assembly -> hooks -> graph_keys (feed
imports assembly only when asked for hooks: it and hooks import TensorFlow).
"""

from antdt_tf.estimator.feed import ShardFeed, shorten_session_wait

__all__ = ["ShardFeed", "shorten_session_wait"]
