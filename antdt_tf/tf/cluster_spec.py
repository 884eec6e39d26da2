"""Parsing the ``--cluster`` flag shared by the TF task and coordinator binaries."""

from __future__ import annotations

import json

from absl import app


def parse_cluster_flag(text: str) -> dict:
    """``--cluster`` JSON (job name -> list of host:port) or a UsageError saying why not."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise app.UsageError(f"--cluster is not valid JSON: {e}") from e
    if not isinstance(spec, dict) or not all(
            isinstance(v, list) and all(isinstance(a, str) for a in v) for v in spec.values()):
        raise app.UsageError('--cluster must map job names to lists of "host:port"')
    return spec


def parse_chief_cluster_flag(text: str) -> dict:
    """``--cluster`` of a chief binary: also needs chief, ps and worker jobs."""
    spec = parse_cluster_flag(text)
    for job in ("chief", "ps", "worker"):
        if not spec.get(job):
            raise app.UsageError(f"the cluster spec needs a {job!r} job")
    return spec


def make_strategy(spec: dict):
    """The chief's ParameterServerStrategy over ``spec``: large tables (embeddings) are
    split over every PS, small variables stay whole. Imports TensorFlow."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc")
    return tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.
        MinSizePartitioner(min_shard_bytes=64 << 10, max_shards=len(spec["ps"])))
