"""The DeepFM of :mod:`antdt_tf.models.deepfm` as a tf-keras model, for ``model.fit``.

Same hashing of the categorical ids, FM first and second order, dense tower. Its
embedding tables are ordinary ``Embedding`` layers: built under a
ParameterServerStrategy with a ``variable_partitioner`` they are split over the PS.
Needs tf-keras (``TF_USE_LEGACY_KERAS=1``).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from antdt_tf.data.criteo import NUM_DENSE, NUM_SPARSE
from antdt_tf.models.deepfm import hash_ids


def build_keras_deepfm(buckets: int = 1 << 16, dim: int = 8, hidden: int = 64,
                       seed: int = 0) -> keras.Model:
    dense_in = keras.Input((NUM_DENSE,), name="dense")
    sparse_in = keras.Input((NUM_SPARSE,), dtype="int64", name="sparse")

    ids = keras.layers.Lambda(lambda s: hash_ids(s, buckets), name="hash")(sparse_in)
    init = keras.initializers.RandomNormal(stddev=0.01, seed=seed)
    emb = keras.layers.Embedding(buckets, dim, embeddings_initializer=init, name="embedding")(ids)
    lin = keras.layers.Embedding(buckets, 1, embeddings_initializer="zeros", name="linear")(ids)
    fm = keras.layers.Lambda(lambda e: 0.5 * tf.reduce_sum(
        tf.square(tf.reduce_sum(e, 1)) - tf.reduce_sum(tf.square(e), 1), 1, keepdims=True),
        name="fm")(emb)
    first = keras.layers.Lambda(lambda l: tf.reduce_sum(l, 1), name="first_order")(lin)
    dense = keras.layers.Lambda(lambda d: tf.math.log1p(tf.maximum(d, 0.0)), name="log1p")(dense_in)
    deep = keras.layers.Concatenate()([dense, keras.layers.Flatten()(emb)])
    deep = keras.layers.Dense(hidden, activation="relu", kernel_initializer=init,
                              name="hidden")(deep)
    deep = keras.layers.Dense(1, kernel_initializer=init, name="deep_logit")(deep)
    logit = keras.layers.Add()([deep, fm, first])
    out = keras.layers.Activation("sigmoid", name="ctr")(keras.layers.Flatten()(logit))
    return keras.Model({"dense": dense_in, "sparse": sparse_in}, out, name="keras_deepfm")
