"""TensorFlow integration: the only package that imports TensorFlow.

- ``reader``: reads a shard (a record range of a compact record file) on the worker
  with TF ops only — one seek, no Python on the data path.
"""
