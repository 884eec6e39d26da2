"""Reading a shard on the worker with TF ops only.

``shard_dataset(path, start, length, batch_size)`` builds a ``tf.data`` pipeline over
records ``[start, start + length)`` of a compact record file (``antdt_tf.data.records``):
``FixedLengthRecordDataset`` with ``header_bytes`` set to the byte offset of ``start``,
``take(length)``, batch, decode. ``start`` and ``length`` may be tensors, so one traced
``tf.function`` serves every shard without retracing.

Known limit (measured with strace on TF 2.21): ``FixedLengthRecordDataset`` *reads*
its header bytes rather than seeking past them, so a shard deep in a big file costs a
read of the prefix (tens of ms at the end of a 264 MB file, from the page cache). Keep
record files in chunks (a dataset is a list of files; shards never cross files) until
the reader moves to a true seek.
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


def raw_shard_dataset(path, start, length, batch_size: int) -> tf.data.Dataset:
    """Batches of raw records ``[start, start + length)`` of ``path``; decode each batch
    with :func:`decode_records` (decoding in the consumer is cheaper per shard than a
    ``map`` stage: one iterator fewer to build for every shard)."""
    start = tf.cast(start, tf.int64)
    ds = tf.data.FixedLengthRecordDataset(
        path, RECORD_BYTES, header_bytes=HEADER_BYTES + start * RECORD_BYTES)
    return ds.take(tf.cast(length, tf.int64)).batch(batch_size)


def shard_dataset(path, start, length, batch_size: int) -> tf.data.Dataset:
    """The records ``[start, start + length)`` of ``path``, decoded, in batches of
    ``batch_size`` (the last one may be smaller)."""
    return raw_shard_dataset(path, start, length, batch_size).map(decode_records)
