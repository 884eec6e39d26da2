"""A DeepFM-style CTR model with hashed embeddings partitioned across the PS tasks.

Plain ``tf.Variable``s created under ``ParameterServerStrategy.scope()`` (the strategy's
``variable_partitioner`` shards the embedding tables over the PS tasks) and a plain SGD
update applied inside the step, so the step runs in any replica context without a Keras
optimizer (Keras 3 optimizers lose updates under PSS; see DESIGN notes).
"""

from __future__ import annotations

import tensorflow as tf

from antdt_tf.data.criteo import NUM_DENSE, NUM_SPARSE


def hash_ids(sparse, buckets: int):
    """Bucket of every categorical id (per-feature offsets; missing -> bucket 0). Shared
    by every DeepFM variant (TF2, Keras, TF1 graph), so one data file trains each alike."""
    ids = tf.where(sparse < 0, tf.zeros_like(sparse), sparse + 1)
    offset = tf.range(NUM_SPARSE, dtype=tf.int64)[None, :] * 1_000_003
    return tf.math.floormod(ids * 31 + offset, buckets)


class DeepFM(tf.Module):
    """First-order + FM second-order terms over hashed ids, plus a dense tower."""

    def __init__(self, buckets: int = 1 << 16, dim: int = 8, hidden: int = 64,
                 learning_rate: float = 0.05, audit_records: int = 0, seed: int = 0):
        super().__init__(name="deepfm")
        init = tf.random_normal_initializer(stddev=0.01, seed=seed)
        self.buckets = buckets
        self.learning_rate = learning_rate
        self.embedding = tf.Variable(init([buckets, dim]), name="embedding")
        self.linear = tf.Variable(tf.zeros([buckets, 1]), name="linear")
        self.w1 = tf.Variable(init([NUM_DENSE + NUM_SPARSE * dim, hidden]), name="w1")
        self.b1 = tf.Variable(tf.zeros([hidden]), name="b1")
        self.w2 = tf.Variable(init([hidden, 1]), name="w2")
        self.bias = tf.Variable(tf.zeros([1]), name="bias")
        # audit: how many times each record's gradient was applied
        self.applied = (tf.Variable(tf.zeros([audit_records], tf.int32), name="applied",
                                    trainable=False) if audit_records else None)

    def _hash(self, sparse):
        return hash_ids(sparse, self.buckets)

    def logits(self, batch, emb, lin):
        dense = tf.math.log1p(tf.maximum(batch["dense"], 0.0))
        n = tf.shape(dense)[0]
        fm = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(emb, 1)) - tf.reduce_sum(tf.square(emb), 1), 1)
        deep_in = tf.concat([dense, tf.reshape(emb, [n, -1])], 1)
        deep = tf.nn.relu(deep_in @ self.w1 + self.b1) @ self.w2
        return tf.squeeze(deep, 1) + fm + tf.reduce_sum(tf.squeeze(lin, 2), 1) + self.bias

    def predict_logits(self, batch):
        """Logits for a decoded batch (no gradient, no audit)."""
        idx = self._hash(batch["sparse"])
        n = tf.shape(idx)[0]
        flat = tf.reshape(idx, [-1])
        emb = tf.reshape(tf.gather(self.embedding, flat), [n, NUM_SPARSE, -1])
        lin = tf.reshape(tf.gather(self.linear, flat), [n, NUM_SPARSE, 1])
        return self.logits(batch, emb, lin)

    @property
    def sparse_tables(self) -> dict:
        """The embedding tables a step updates row by row (BSP stages their rows)."""
        return {"embedding": self.embedding, "linear": self.linear}

    @property
    def dense_variables(self) -> list:
        return [self.w1, self.b1, self.w2, self.bias]

    ids_per_record = NUM_SPARSE

    def gradients(self, batch):
        """``(loss, ids, rows, dense)`` of one batch, nothing applied: ``rows[name]`` are
        the gradient rows of ``sparse_tables[name]`` at ``ids`` (one per id, repeats
        allowed), ``dense`` the gradients of ``dense_variables``."""
        idx = self._hash(batch["sparse"])
        flat = tf.reshape(idx, [-1])
        with tf.GradientTape() as tape:
            emb_rows = tf.gather(self.embedding, flat)
            lin_rows = tf.gather(self.linear, flat)
            tape.watch([emb_rows, lin_rows])
            n = tf.shape(idx)[0]
            emb = tf.reshape(emb_rows, [n, NUM_SPARSE, -1])
            lin = tf.reshape(lin_rows, [n, NUM_SPARSE, 1])
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=batch["label"], logits=self.logits(batch, emb, lin)))
        grads = tape.gradient(loss, [emb_rows, lin_rows] + self.dense_variables)
        return loss, flat, {"embedding": grads[0], "linear": grads[1]}, grads[2:]

    def train_step(self, batch, record_ids):
        """One SGD step on ``batch``; counts the records in the audit counter."""
        loss, flat, rows, dense = self.gradients(batch)
        lr = self.learning_rate
        for name, table in self.sparse_tables.items():
            table.scatter_sub(tf.IndexedSlices(lr * rows[name], flat))
        for var, grad in zip(self.dense_variables, dense):
            var.assign_sub(lr * grad)
        if self.applied is not None:
            self.applied.scatter_add(tf.IndexedSlices(
                tf.ones_like(record_ids, tf.int32), record_ids))
        return loss
