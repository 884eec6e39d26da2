"""Monitor: what every task of the job is doing, as reported by agents and trainers.

``ClusterView`` (pure Python, no TensorFlow or gRPC) keeps the latest report of every
agent and of the trainer; the master serves it as ``antdt.v1.ClusterMonitor``.
"""

from antdt_tf.monitor.view import ClusterView

__all__ = ["ClusterView"]
