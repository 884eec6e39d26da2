"""The DeepFM ranking model as TF1 graph code (``tf.compat.v1``), the way Estimator and
``MonitoredTrainingSession`` jobs write it: ``get_variable`` with a
``fixed_size_partitioner`` (embedding tables split over the PS tasks), a v1 optimizer,
and the optional audit counter. Runs on TF 2.15 (Estimator) and TF 2.21 (graph mode).
"""

from __future__ import annotations

import tensorflow as tf

from antdt_tf.data.criteo import NUM_DENSE, NUM_SPARSE
from antdt_tf.models.deepfm import hash_ids

v1 = tf.compat.v1


def deepfm_logits(dense, sparse, num_ps: int, buckets: int, dim: int = 8, hidden: int = 64):
    """Logits of a batch; creates (or reuses) the model's variables."""
    part = v1.fixed_size_partitioner(num_ps) if num_ps > 1 else None
    init = v1.random_normal_initializer(stddev=0.01, seed=0)
    with v1.variable_scope("deepfm", reuse=v1.AUTO_REUSE):
        embedding = v1.get_variable("embedding", [buckets, dim], initializer=init,
                                    partitioner=part)
        linear = v1.get_variable("linear", [buckets, 1], initializer=v1.zeros_initializer(),
                                 partitioner=part)
        w1 = v1.get_variable("w1", [NUM_DENSE + NUM_SPARSE * dim, hidden], initializer=init)
        b1 = v1.get_variable("b1", [hidden], initializer=v1.zeros_initializer())
        w2 = v1.get_variable("w2", [hidden, 1], initializer=init)
        bias = v1.get_variable("bias", [1], initializer=v1.zeros_initializer())
    ids = hash_ids(sparse, buckets)
    n = tf.shape(ids)[0]
    emb = tf.nn.embedding_lookup(embedding, ids)              # [n, 26, dim]
    lin = tf.nn.embedding_lookup(linear, ids)                 # [n, 26, 1]
    dense = tf.math.log1p(tf.maximum(dense, 0.0))
    fm = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(emb, 1)) - tf.reduce_sum(tf.square(emb), 1), 1)
    deep = tf.nn.relu(tf.concat([dense, tf.reshape(emb, [n, NUM_SPARSE * dim])], 1) @ w1 + b1) @ w2
    return tf.squeeze(deep, 1) + fm + tf.reduce_sum(tf.squeeze(lin, 2), 1) + bias


def deepfm_train_op(features, labels, num_ps: int, buckets: int, learning_rate: float = 0.05,
                    audit_records: int = 0):
    """``(loss, train_op)``. With ``audit_records``, the same step also adds 1 to
    ``antdt_audit[record_id]`` for every record of the batch (a PS variable), after the
    gradient update: how many times each record was applied."""
    logits = deepfm_logits(features["dense"], features["sparse"], num_ps, buckets)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    global_step = v1.train.get_or_create_global_step()
    train_op = v1.train.GradientDescentOptimizer(learning_rate).minimize(loss, global_step)
    if audit_records:
        audit = v1.get_variable("antdt_audit", [audit_records], tf.int32,
                                initializer=v1.zeros_initializer(), trainable=False)
        with tf.control_dependencies([train_op]):
            ids = features["record_id"]
            train_op = v1.scatter_add(audit, ids, tf.ones_like(ids, tf.int32)).op
    return loss, train_op


def audit_variable():
    with v1.variable_scope("", reuse=True):
        return v1.get_variable("antdt_audit", dtype=tf.int32)
