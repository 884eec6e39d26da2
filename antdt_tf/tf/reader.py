"""Reading a shard on the worker with TF ops only.

``shard_dataset(path, start, length, batch_size)`` builds a ``tf.data`` pipeline over
records ``[start, start + length)`` of a compact record file (``antdt_tf.data.records``):
``FixedLengthRecordDataset`` with ``header_bytes`` set to the byte offset of ``start``
(one seek, however far into the file), ``take(length)``, batch, decode. ``start`` and
``length`` may be tensors, so one traced ``tf.function`` serves every shard without
retracing.
"""

from __future__ import annotations

import tensorflow as tf

from antdt_tf.data.criteo import NUM_DENSE, NUM_SPARSE
from antdt_tf.data.records import HEADER_BYTES, record_dtype

RECORD_BYTES = record_dtype().itemsize
_DENSE_END = 4 + 4 * NUM_DENSE


def decode_records(raw: tf.Tensor) -> dict:
    """Decodes a batch of raw records (a string tensor of shape [n]) into
    ``{"label": f32[n], "dense": f32[n,13], "sparse": i64[n,26]}``."""
    b = tf.io.decode_raw(raw, tf.uint8)
    b = tf.reshape(b, [-1, RECORD_BYTES])
    label = tf.bitcast(tf.reshape(b[:, :4], [-1, 4]), tf.float32)
    dense = tf.bitcast(tf.reshape(b[:, 4:_DENSE_END], [-1, NUM_DENSE, 4]), tf.float32)
    sparse = tf.bitcast(tf.reshape(b[:, _DENSE_END:], [-1, NUM_SPARSE, 8]), tf.int64)
    return {"label": label, "dense": dense, "sparse": sparse}


def shard_dataset(path, start, length, batch_size: int) -> tf.data.Dataset:
    """The records ``[start, start + length)`` of ``path`` in batches of ``batch_size``
    (the last one may be smaller)."""
    start = tf.cast(start, tf.int64)
    ds = tf.data.FixedLengthRecordDataset(
        path, RECORD_BYTES, header_bytes=HEADER_BYTES + start * RECORD_BYTES)
    return ds.take(tf.cast(length, tf.int64)).batch(batch_size).map(decode_records)
