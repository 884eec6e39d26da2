"""TF1-style training (``MonitoredTrainingSession``, ``tf.estimator``) on the master's
shards: :class:`ShardFeed` (input function + hooks). TensorFlow is imported when the
feed builds its graph, so this package imports under any TF version the hooks run on."""

from antdt_tf.estimator.feed import ShardFeed, shorten_session_wait

__all__ = ["ShardFeed", "shorten_session_wait"]
